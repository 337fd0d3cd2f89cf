"""The divergence benchmark on the real SmolLM2 (CPU, a few short chunks): INT8 passes the shipped
gate, the 4-bit control fails it, the prefill trap is exactly 0; a gate or control that does not
behave fails the run; `kvbench divergence` runs without lm-eval, datasets or matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy import DivergenceResult
from kvbench.accuracy._config import DEFAULT_CONFIG, DivergenceSpec, load_config
from kvbench.accuracy._divergence import run_divergence

# Two chunks of 64 tokens for INT8, the first of them for the controls: 7 short forwards.
_SPEC = DivergenceSpec(
    index=0,
    corpus="coqa-stories",
    tokens=128,
    chunk_length=64,
    control_tokens=64,
    attention=None,
    attention_name="runs[0].attention",
)
# The nightly's own gate, so the test shows that the shipped thresholds tell the caches apart.
_SHIPPED_GATE = load_config(DEFAULT_CONFIG).divergence_gate


def _run(smollm2: Any, tmp_path: Path, **gate_changes: float) -> DivergenceResult:
    assert _SHIPPED_GATE is not None
    model, tokenizer = smollm2
    return run_divergence(
        _SPEC,
        replace(_SHIPPED_GATE, **gate_changes),
        ("reference",),
        model=model,
        tokenizer=tokenizer,
        baseline="auto",
        candidate="int8",
        plot_path=tmp_path / "kld.png",
        progress=False,
    )


@pytest.fixture(scope="module")
def shipped(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> DivergenceResult:
    return _run(smollm2, tmp_path_factory.mktemp("divergence"))


def _rows(result: DivergenceResult) -> dict[str, dict[str, Any]]:
    return {row["arm"]: row for row in result.rows}


def test_int8_passes_the_4_bit_control_fails_and_the_trap_is_exactly_0(
    shipped: DivergenceResult,
) -> None:
    rows = _rows(shipped)
    assert [(r["arm"], r["expected"], r["verdict"]) for r in shipped.rows] == [
        ("candidate", "passed", "passed"),
        ("degraded", "failed", "failed"),
        ("trap", "exactly-0", "exactly-0"),
    ]
    assert shipped.passed and all(row["behaved"] for row in shipped.rows)
    int8, int4, trap = rows["candidate"], rows["degraded"], rows["trap"]
    assert (int8["tokens"], int4["tokens"], trap["tokens"]) == (126, 63, 63)
    # INT8 is read (a real, small divergence), the 4-bit cache far more.
    assert 0 < int8["mean_kld"] < _SHIPPED_GATE.max_mean_kld / 2  # type: ignore[union-attr]
    assert int4["mean_kld"] > 20 * int8["mean_kld"]
    assert int4["same_top1"] < int8["same_top1"] and int4["ppl_ratio"] > int8["ppl_ratio"]
    assert int8["mean_kld_stderr"] > 0 and int8["ppl_ratio_stderr"] > 0
    assert not int8["identical"]
    assert trap["identical"]
    assert (trap["mean_kld"], trap["max_kld"], trap["rms_dp"]) == (0.0, 0.0, 0.0)
    assert (trap["same_top1"], trap["ppl_ratio"]) == (1.0, 1.0)
    # Per chunk and overall, and the chunks' positions add up.
    assert [c["tokens"] for c in int8["chunks"]] == [63, 63]
    assert len(int4["chunks"]) == len(trap["chunks"]) == 1
    assert Path(str(shipped.plot)).read_bytes().startswith(b"\x89PNG")


def test_a_gate_tighter_than_int8s_divergence_fails_it(
    smollm2: Any, shipped: DivergenceResult, tmp_path: Path
) -> None:
    measured = _rows(shipped)["candidate"]["mean_kld"]
    result = _run(smollm2, tmp_path, max_mean_kld=measured / 2)
    candidate = _rows(result)["candidate"]
    assert candidate["verdict"] == "failed" and candidate["checks"]["mean_kld"] is False
    assert candidate["mean_kld"] == measured  # the same tokens, the same numbers
    assert not result.passed


def test_a_gate_too_loose_to_fail_the_4_bit_cache_fails_the_run(
    smollm2: Any, tmp_path: Path
) -> None:
    result = _run(smollm2, tmp_path, max_mean_kld=10.0, min_same_top1=0.0, max_ppl_ratio=10.0)
    degraded = _rows(result)["degraded"]
    assert (degraded["expected"], degraded["verdict"], degraded["behaved"]) == (
        "failed",
        "passed",
        False,
    )
    assert not result.passed


# `kvbench divergence` where lm-eval, datasets and matplotlib are not installed (the GPU machine
# has none of them): the import system finds no such package, as in an environment without them.
_RUN_WITHOUT = """
import sys
from importlib.machinery import PathFinder

hidden = {hidden!r}
path_find_spec = PathFinder.find_spec.__func__


def find_spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in hidden:
        return None
    return path_find_spec(cls, name, path, target)


PathFinder.find_spec = classmethod(find_spec)
from kvbench.__main__ import main

code = main({argv!r})
loaded = sorted(name for name in sys.modules if name.partition(".")[0] in hidden)
print("loaded:", loaded)
sys.exit(code)
"""
_CONFIG = """
[gate]
max_mean_kld = 0.005
min_same_top1 = 0.95
max_ppl_ratio = 1.01
path_agreement = 0.1

[[runs]]
mode = "divergence"
corpus = "lambada-passages"
tokens = 128
chunk_length = 64
control_tokens = 64
"""


def test_kvbench_divergence_needs_no_lm_eval_datasets_or_matplotlib(tmp_path: Path) -> None:
    config = tmp_path / "divergence.toml"
    config.write_text(_CONFIG, encoding="utf-8")
    json_out = tmp_path / "result.json"
    argv = ["divergence", "--config", str(config), "--out", str(tmp_path / "out")]
    argv += ["--json", str(json_out), "--quiet", "--tokens", "64"]
    code = _RUN_WITHOUT.format(hidden={"lm_eval", "datasets", "matplotlib"}, argv=argv)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    result = json.loads(json_out.read_text(encoding="utf-8"))
    assert json.loads((tmp_path / "out" / "divergence.json").read_text()) == result
    (divergence,) = result["divergence"]
    assert (divergence["corpus"], divergence["chunks"], divergence["plot"]) == (
        "lambada-passages",
        1,  # --tokens 64 overrides the config's 128
        None,
    )
    assert [row["verdict"] for row in divergence["rows"]] == ["passed", "failed", "exactly-0"]
    assert result["rows"] == [] and result["gate"]["passed"]
    assert "plot: not drawn (no matplotlib)" in done.stdout
    assert not (tmp_path / "out" / "accuracy.json").exists()
