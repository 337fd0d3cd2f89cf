"""run_accuracy and the CLI end to end on the real model and tiny task subsets; bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy import (
    ModelLoadError,
    UnknownTaskError,
    UnsupportedModelError,
    run_accuracy,
)

from conftest import run_cli

_TINY_CONFIG = """
[gate]
tolerance = 0.05

[[runs]]
mode = "decode"
tasks = ["kvb_arc_easy"]
limit = 2

[[runs]]
mode = "generate"
tasks = ["kvb_lambada"]
limit = 2
"""


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "accuracy.toml"
    path.write_text(_TINY_CONFIG, encoding="utf-8")
    return path


def test_cli_runs_pairs_and_plots(tiny_config: Path, tmp_path: Path, capsys: Any) -> None:
    out, json_out = tmp_path / "out", tmp_path / "result.json"
    code = run_cli(
        [
            "accuracy",
            "--config",
            str(tiny_config),
            "--out",
            str(out),
            "--json",
            str(json_out),
            "--quiet",
        ]
    )
    result = json.loads(json_out.read_text(encoding="utf-8"))
    assert code == (0 if result["gate"]["passed"] else 1)
    assert result["tasks"] == ["kvb_arc_easy", "kvb_lambada"]
    keys = {(r["task"], r["metric"], r["mode"]) for r in result["rows"]}
    assert keys == {("kvb_arc_easy", "acc", "decode"), ("kvb_lambada", "exact_match", "generate")}
    for row in result["rows"]:
        assert row["n"] == 2
        assert row["ci_low"] <= row["delta"] <= row["ci_high"]
        assert row["flips_up"] is not None and row["mcnemar_p"] is not None
    assert Path(result["plot"]).read_bytes().startswith(b"\x89PNG")
    timed = [(t["mode"], t["kv_cache_dtype"]) for t in result["timings"]]
    assert timed == [(mode, dtype) for mode in ("decode", "generate") for dtype in ("auto", "int8")]
    assert all(0 < t["seconds"] < result["elapsed_s"] for t in result["timings"])
    table = capsys.readouterr().out
    assert "kvb_arc_easy" in table and "gate (|delta| <= max(0.05, 2 stderr))" in table


def test_rerun_reads_finished_requests_from_the_cache(tiny_config: Path, tmp_path: Path) -> None:
    from sqlitedict import SqliteDict

    out = tmp_path / "out"
    first = run_accuracy(tiny_config, out_dir=out, progress=False)
    # Plant a wrong answer for every cached INT8 generation: if the rerun recomputed them, the
    # exact-match scores could not all drop to zero.
    (db_path,) = (out / "lm-eval-cache").glob("*generate-int8*.db")
    with SqliteDict(str(db_path), autocommit=True) as cached:
        assert len(cached) == 2
        for key in list(cached):
            cached[key] = "#not-a-word#"
    second = run_accuracy(tiny_config, out_dir=out, progress=False)
    lambada = next(r for r in second.rows if r["task"] == "kvb_lambada")
    assert lambada["int8"] == 0.0
    assert [r for r in second.rows if r["task"] == "kvb_arc_easy"] == [
        r for r in first.rows if r["task"] == "kvb_arc_easy"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/nonexistent/model"], "`model` path /nonexistent/model does not exist"),
        (["--limit", "0"], "`--limit` is 0; expected >= 1"),
    ],
)
def test_bad_arguments_get_one_line_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: Any
) -> None:
    assert run_cli(["accuracy", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_task_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[runs]]\nmode = "decode"\ntasks = ["kvb_nope"]\n', encoding="utf-8")
    with pytest.raises(UnknownTaskError, match="task 'kvb_nope' is unknown; expected one of"):
        run_accuracy(config, out_dir=tmp_path)


def test_encoder_only_model_is_refused(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForMaskedLM

    model_dir = tmp_path / "tiny-bert"
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertForMaskedLM(config).save_pretrained(model_dir)
    with pytest.raises(UnsupportedModelError, match="without a decoder KV cache"):
        run_accuracy(model=str(model_dir), out_dir=tmp_path / "out")


def test_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        run_accuracy(model=str(tmp_path), out_dir=tmp_path / "out")
