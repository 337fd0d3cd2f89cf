"""A Hugging Face causal LM whose attention reads a kvquant cache: loading it, giving it a cache
session, and running tokens through that session.

Needs torch and transformers only (no lm-eval), so the divergence benchmark runs wherever the
model does; the lm-eval model ``kvquant-hf`` is built on the same three functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ._config import MODEL_DTYPES
from ._errors import AccuracyError, ModelLoadError, UnsupportedModelError
from ._kv_attention import (
    ATTN_IMPLEMENTATION,
    BatchKVSession,
    KVSession,
    new_batch_session,
    new_session,
    register_attention,
)
from ._model_files import check_has_kv_cache, resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_model(
    model: str | None, device: str, dtype: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``model`` (None: the default SmolLM2) with the kvquant attention.

    ``dtype="auto"`` is fp32 on the CPU (exact reference numerics) and bf16 on a GPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = resolve_model(model)
    check_has_kv_cache(model_dir)
    register_attention()
    if dtype not in MODEL_DTYPES:
        raise AccuracyError(f"`dtype` is {dtype!r}; expected one of {', '.join(MODEL_DTYPES)}")
    if dtype == "auto":
        torch_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        torch_dtype = getattr(torch, dtype)
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"`device` is {device!r} but no CUDA device is available; expected cpu"
        raise AccuracyError(msg)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=torch_dtype,
            attn_implementation=ATTN_IMPLEMENTATION,
            device_map=device,
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except ValueError as error:
        # transformers refuses custom attention for models that do not route through it.
        msg = f"`model` {model_dir} cannot use the kvquant attention: {str(error).splitlines()[0]}"
        raise UnsupportedModelError(msg) from None
    except OSError as error:
        msg = f"`model` {model_dir} could not be loaded: {str(error).splitlines()[0]}"
        raise ModelLoadError(msg) from None
    # from_pretrained returns the model in eval mode: no dropout.
    return hf_model, tokenizer


def _kv_shape(model: PreTrainedModel) -> tuple[int, int, int]:
    """(layers, kv heads, head size) of ``model``'s KV cache."""
    config = model.config.get_text_config()
    head_size = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    num_kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    return config.num_hidden_layers, num_kv_heads, head_size


def model_session(
    model: PreTrainedModel,
    *,
    kv_cache_dtype: str,
    prefill_reads_cache: bool,
    max_tokens: int,
    kernels: bool | None = None,
) -> KVSession:
    """A cache session shaped for ``model``'s layers and KV heads (see `new_session`)."""
    num_layers, num_kv_heads, head_size = _kv_shape(model)
    return new_session(
        kv_cache_dtype=kv_cache_dtype,
        model_dtype=model.dtype,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        max_tokens=max_tokens,
        device=model.device,
        prefill_reads_cache=prefill_reads_cache,
        kernels=kernels,
    )


def model_batch_session(
    model: PreTrainedModel,
    *,
    kv_cache_dtype: str,
    batch: int,
    max_tokens: int,
    kernels: bool | None = None,
) -> BatchKVSession:
    """A batch cache session shaped for ``model`` (see `new_batch_session`)."""
    num_layers, num_kv_heads, head_size = _kv_shape(model)
    return new_batch_session(
        kv_cache_dtype=kv_cache_dtype,
        model_dtype=model.dtype,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        batch=batch,
        max_tokens=max_tokens,
        device=model.device,
        kernels=kernels,
    )


def forward_batch(
    model: PreTrainedModel, session: BatchKVSession, tokens: torch.Tensor
) -> torch.Tensor:
    """Run ``tokens [batch, n]`` at the session's next positions of every sequence; fp32 logits
    ``[batch, vocab]`` of each sequence's last position."""
    start = session.length
    n = tokens.shape[1]
    position_ids = torch.arange(start, start + n, device=tokens.device)[None].expand(
        tokens.shape[0], n
    )
    with torch.inference_mode():
        out = model(
            input_ids=tokens,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=1,
            kv_session=session,
        )
    session.length = start + n
    logits: torch.Tensor = out.logits[:, -1].float()
    return logits


def forward(
    model: PreTrainedModel, session: KVSession, tokens: Sequence[int], logits_to_keep: int
) -> torch.Tensor:
    """Run ``tokens`` at the session's next positions; fp32 logits of the last few rows."""
    start = session.length
    device = model.device
    input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    position_ids = torch.arange(start, start + len(tokens), device=device)[None]
    with torch.inference_mode():
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=logits_to_keep,
            kv_session=session,
        )
    session.length = start + len(tokens)
    logits: torch.Tensor = out.logits[0].float()
    return logits
