"""Attention for Hugging Face models that reads K and V back from a KV cache we own.

The model runs with ``use_cache=False`` and ``attn_implementation="kvquant"``; every forward call
passes a `KVSession` as the ``kv_session`` keyword, which transformers hands to each attention
call. Each layer writes its new tokens' K/V into the session's cache for that layer and then
attends over what the cache holds, so INT8 rounding reaches every query that reads the cache.

Caches by ``kv_cache_dtype``:
- ``int8``: a kvquant paged cache, per-(token, kv-head) dynamic scales. kvquant's torch reference
  on CPU, its Triton kernels on a GPU (or the reference there too, to compare the two paths).
- ``auto``: the model dtype. A kvquant 16-bit paged cache for fp16/bf16 models; for fp32 models
  (CPU), which kvquant does not store, a dense fp32 cache, i.e. exact.
- ``fp8_e4m3``: emulated as vLLM stores fp8 without calibrated scales (per-tensor scale 1.0;
  values beyond +-448 clamp), rounded through torch.float8_e4m3fn and read back as fp32.
- ``int4`` (and ``int5``...``int7``): the divergence benchmark's controls, never caches to ship:
  symmetric codes of that many bits with one scale per (token, kv head). Emulated in torch in the
  one-sequence sessions; in a batch session on the kernels they are written as INT8 codes and
  scales into a kvquant INT8 cache, so the INT8 kernels read them (`coarse_codes`).

A `BatchKVSession` holds a batch of sequences of equal length, decoded together: each layer
writes the batch's new K/V at the same positions of every sequence, then a one-token forward
reads them through ``kvquant.decode_attention`` (the kernels) or kvquant's torch reference.

On the torch reference path each layer also keeps the fp32 values its cache reads back, filled
as tokens are written, so a decode step costs its one new token rather than the whole sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kvquant.cache_dtypes import ACCURACY, CONTROL, UnknownCacheDTypeError, cache_dtype

from ._config import CONTROL_CACHE_BITS
from ._errors import AccuracyError, UnsupportedModelError

ATTN_IMPLEMENTATION = "kvquant"
# kvquant's page size; 16 is vLLM's default block size.
_BLOCK_SIZE = 16
# Largest finite float8_e4m3fn value; torch's cast would turn larger values into NaN.
_FP8_E4M3_MAX = 448.0


def coarse_codes(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """INT8's scheme with ``bits``-bit codes: int8 codes in ``[-2**(bits-1), 2**(bits-1) - 1]``
    and fp32 scales ``absmax / (2**(bits-1) - 1)`` per vector (the last dim), so each value moves
    by up to half a scale. ``codes * scale[..., None]`` is what the cache reads back."""
    from kvquant.reference import SCALE_FLOOR, round_half_away_from_zero

    top = (1 << (bits - 1)) - 1
    x = x.float()
    scale = torch.clamp(x.abs().amax(dim=-1) / top, min=SCALE_FLOOR)
    codes = round_half_away_from_zero(x / scale[..., None]).clamp(-top - 1, top)
    return codes.to(torch.int8), scale


class _LayerCache(Protocol):
    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        """Store ``key``/``value [n, num_kv_heads, head_size]`` at positions ``start...``."""

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        """Causal attention of the newest ``q_len`` positions over the first ``seq_len`` keys."""


class _KernelLayerCache:
    """One layer's kvquant paged cache served by its Triton kernels (GPU), one sequence at a time.

    Positions map to slots one to one (the block table is the identity), so writing the tokens
    at ``start...`` and then reading ``start + q`` keys is all that a single sequence needs.
    """

    def __init__(
        self,
        cache_dtype: torch.dtype,
        num_kv_heads: int,
        head_size: int,
        max_tokens: int,
        device: torch.device,
    ) -> None:
        import kvquant

        num_blocks = math.ceil(max_tokens / _BLOCK_SIZE)
        self._cache = kvquant.allocate_cache(
            num_blocks, num_kv_heads, head_size, _BLOCK_SIZE, cache_dtype, device
        )
        self._block_table = torch.arange(num_blocks, dtype=torch.int32, device=device)[None]

    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        import kvquant

        slots = torch.arange(start, start + key.shape[0], dtype=torch.int64, device=key.device)
        kvquant.cache_write(self._cache, key, value, slots)

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        import kvquant

        seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=query.device)
        if query.shape[0] == 1:
            return kvquant.decode_attention(
                query,
                self._cache,
                self._block_table,
                seq_lens,
                softmax_scale,
                sliding_window=sliding_window,
                softcap=softcap,
            )
        cu_seqlens_q = torch.tensor([0, query.shape[0]], dtype=torch.int32, device=query.device)
        return kvquant.prefill_attention(
            query,
            self._cache,
            self._block_table,
            seq_lens,
            cu_seqlens_q,
            softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
        )


class _ReadBackLayerCache:
    """One layer's cache on the torch reference path, held as the fp32 values it reads back.

    Each write rounds only its new tokens as the cache stores them and keeps them widened to
    fp32, so attention sees exactly what kvquant's ``reference.gather_kv`` would return for an
    INT8 or 16-bit paged cache, but a decode step rounds one token instead of the sequence.
    INT8 goes through kvquant's ``reference.quantize_per_token_head`` and ``dequantize``; fp8 is
    clamped and cast; 16-bit and fp32 are cast.
    """

    def __init__(
        self,
        storage_dtype: torch.dtype,
        num_kv_heads: int,
        head_size: int,
        max_tokens: int,
        device: torch.device,
    ) -> None:
        self._storage_dtype = storage_dtype
        shape = (max_tokens, num_kv_heads, head_size)
        self._k = torch.empty(shape, dtype=torch.float32, device=device)
        self._v = torch.empty(shape, dtype=torch.float32, device=device)
        # First position whose stored V holds a NaN or inf; max_tokens while there is none.
        self._nonfinite_from = max_tokens

    def _stored(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``[2, n, num_kv_heads, head_size]`` fp32: K and V as the cache would read them back."""
        from kvquant import reference

        both = torch.stack((key, value))
        if self._storage_dtype == torch.int8:
            # Scales are per vector, so quantizing K and V in one call changes no code or scale.
            codes, scale = reference.quantize_per_token_head(both)
            return reference.dequantize(codes, scale)
        if self._storage_dtype == torch.float8_e4m3fn:
            both = both.float().clamp(-_FP8_E4M3_MAX, _FP8_E4M3_MAX)
        return both.to(self._storage_dtype).float()

    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        end = start + key.shape[0]
        k, v = self._stored(key, value)
        self._k[start:end] = k
        self._v[start:end] = v
        if self._nonfinite_from >= start:
            self._nonfinite_from = self._k.shape[0]
            bad = (~torch.isfinite(v).all(dim=(1, 2))).nonzero()
            if bad.numel():
                self._nonfinite_from = start + int(bad[0])

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        from kvquant.reference import attention_ref

        return attention_ref(
            query,
            self._k[:seq_len],
            self._v[:seq_len],
            softmax_scale,
            sliding_window,
            softcap,
            values_finite=self._nonfinite_from >= seq_len,
        )


class _CoarseReadBackLayerCache(_ReadBackLayerCache):
    """A control: INT8's scheme with fewer bits (`coarse_codes`; 4 bits move each value by up to
    half of ``absmax / 7`` instead of ``absmax / 127``). Read back as fp32 like the others."""

    bits = 4

    def _stored(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        codes, scale = coarse_codes(torch.stack((key, value)), self.bits)
        return codes * scale[..., None]


def _coarse_read_back(bits: int) -> type[_CoarseReadBackLayerCache]:
    return type(f"_Int{bits}ReadBackLayerCache", (_CoarseReadBackLayerCache,), {"bits": bits})


@dataclass
class KVSession:
    """The caches of one model for the sequence being scored, and how prefill attends.

    Attributes:
        layers: one cache per decoder layer, indexed by the attention module's ``layer_idx``.
        prefill_reads_cache: False makes a prefill (a first forward of several tokens) attend to
            the fresh 16-bit K/V, as engines that skip their cache in prefill do. The K/V are
            still written, so later decode steps read them from the cache.
        length: tokens already in the cache; the next forward's tokens start here.
    """

    layers: list[_LayerCache]
    prefill_reads_cache: bool
    length: int = field(default=0)


def cache_storage(kv_cache_dtype: str, model_dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """("paged" | "dense" | "coarse", element dtype) for a ``kv_cache_dtype`` name; rejects
    unknown names (`kvquant.cache_dtypes`). "coarse" is a control (`CONTROL_CACHE_BITS`), its
    codes held in int8."""
    try:
        cache_dtype(kv_cache_dtype, ACCURACY, CONTROL)
    except UnknownCacheDTypeError as error:
        raise AccuracyError(f"`kv_cache_dtype`: {error}") from None
    if kv_cache_dtype == "int8":
        return "paged", torch.int8
    if kv_cache_dtype in CONTROL_CACHE_BITS:
        return "coarse", torch.int8
    if kv_cache_dtype == "fp8_e4m3":
        return "dense", torch.float8_e4m3fn
    if model_dtype in (torch.float16, torch.bfloat16):  # "auto": the model's own dtype
        return "paged", model_dtype
    return "dense", model_dtype


def new_session(
    *,
    kv_cache_dtype: str,
    model_dtype: torch.dtype,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    max_tokens: int,
    device: torch.device,
    prefill_reads_cache: bool,
    kernels: bool | None = None,
) -> KVSession:
    """Allocate every layer's cache for sequences of up to ``max_tokens`` tokens.

    ``kernels`` (default: on a GPU) serves the paged caches with kvquant's Triton kernels; else,
    and for caches kvquant does not page, a `_ReadBackLayerCache` on kvquant's torch reference
    does, so the CPU needs no Triton interpreter and a GPU can run both paths on the same tokens.
    """
    import kvquant

    layout, storage_dtype = cache_storage(kv_cache_dtype, model_dtype)
    use_kernels = _use_kernels(kernels, device, model_dtype) and layout == "paged"
    try:
        if layout == "paged" and not use_kernels:
            # The reference path needs no pages, but a model whose K/V kvquant cannot page is
            # refused on the CPU as on a GPU.
            kvquant.allocate_cache(1, num_kv_heads, head_size, _BLOCK_SIZE, storage_dtype, device)
        layer_cache: type[_KernelLayerCache | _ReadBackLayerCache]
        if use_kernels:
            layer_cache = _KernelLayerCache
        elif layout == "coarse":
            layer_cache = _coarse_read_back(CONTROL_CACHE_BITS[kv_cache_dtype])
        else:
            layer_cache = _ReadBackLayerCache
        layers: list[_LayerCache] = [
            layer_cache(storage_dtype, num_kv_heads, head_size, max_tokens, device)
            for _ in range(num_layers)
        ]
    except kvquant.InvalidInputError as error:
        raise UnsupportedModelError(f"the model's KV cache: {error}") from None
    return KVSession(layers=layers, prefill_reads_cache=prefill_reads_cache)


def _use_kernels(kernels: bool | None, device: torch.device, model_dtype: torch.dtype) -> bool:
    """Whether a session serves its paged caches with kvquant's kernels (default: on a GPU). On
    the CPU only where Triton's interpreter runs them (tests); they take fp16/bf16 only."""
    from kvquant.ops._common import interpreted

    if kernels is None:
        kernels = device.type != "cpu"
    if kernels and device.type == "cpu" and not interpreted():
        raise AccuracyError("`attention` is 'kernels' on the CPU; kvquant's kernels need a GPU")
    if kernels and model_dtype not in (torch.float16, torch.bfloat16):
        msg = f"`dtype` is {model_dtype} on {device}; kvquant's kernels expect float16 or bfloat16"
        raise AccuracyError(msg)
    return kernels


class _BatchLayerCache(Protocol):
    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        """Store ``key``/``value [batch, n, num_kv_heads, head_size]`` at ``start...`` of every
        sequence."""

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        """``query [batch, q_len, num_q_heads, head_size]``: causal attention of each sequence's
        newest ``q_len`` positions over its first ``seq_len`` keys, in the same shape."""


class _BatchKernelCache:
    """One layer's kvquant paged cache for a batch of sequences, served by its kernels.

    Sequence b owns pages ``b * pages ... (b + 1) * pages - 1``. A one-token forward reads it
    through ``kvquant.decode_attention`` with the longest context fixed at ``max_tokens``, so
    one decode plan serves every step and nothing is read back on the host; a longer forward
    (the prefill of the texts' start) through ``kvquant.prefill_attention``. ``bits`` writes a
    control's codes (`coarse_codes`) into the INT8 cache instead of kvquant's INT8 rounding.
    """

    def __init__(
        self,
        cache_dtype: torch.dtype,
        bits: int | None,
        batch: int,
        num_kv_heads: int,
        head_size: int,
        max_tokens: int,
        device: torch.device,
    ) -> None:
        import kvquant

        self._pages = math.ceil(max_tokens / _BLOCK_SIZE)
        self._cache = kvquant.allocate_cache(
            batch * self._pages, num_kv_heads, head_size, _BLOCK_SIZE, cache_dtype, device
        )
        self._block_table = torch.arange(
            batch * self._pages, dtype=torch.int32, device=device
        ).view(batch, self._pages)
        self._first_slot = (
            torch.arange(batch, dtype=torch.int64, device=device)[:, None]
            * self._pages
            * _BLOCK_SIZE
        )
        self._bits = bits
        self._max_tokens = max_tokens

    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        import kvquant

        n = key.shape[1]
        positions = torch.arange(start, start + n, dtype=torch.int64, device=key.device)
        slots = (self._first_slot + positions[None]).flatten()
        key, value = key.flatten(0, 1), value.flatten(0, 1)
        if self._bits is None:
            kvquant.cache_write(self._cache, key, value, slots)
            return
        # The layout kvquant.reference.cache_write_ref writes, with a control's codes.
        cache = self._cache
        assert cache.k_scale is not None and cache.v_scale is not None  # an INT8 cache
        blocks, offsets = slots // _BLOCK_SIZE, slots % _BLOCK_SIZE
        k_codes, k_scale = coarse_codes(key, self._bits)
        v_codes, v_scale = coarse_codes(value, self._bits)
        cache.k[blocks, :, offsets, :] = k_codes
        cache.v[blocks, :, :, offsets] = v_codes
        cache.k_scale[blocks, :, offsets] = k_scale
        cache.v_scale[blocks, :, offsets] = v_scale

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        import kvquant

        batch, q_len = query.shape[:2]
        seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=query.device)
        if q_len == 1:
            out = kvquant.decode_attention(
                query[:, 0].contiguous(),
                self._cache,
                self._block_table,
                seq_lens,
                softmax_scale,
                sliding_window=sliding_window,
                softcap=softcap,
                max_seq_len=self._max_tokens,
                validate=False,
            )
            return out[:, None]
        cu_seqlens_q = torch.arange(
            0, batch * q_len + 1, q_len, dtype=torch.int32, device=query.device
        )
        out = kvquant.prefill_attention(
            query.reshape(batch * q_len, *query.shape[2:]).contiguous(),
            self._cache,
            self._block_table,
            seq_lens,
            cu_seqlens_q,
            softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
        )
        return out.view(query.shape)


class _BatchReadBackCache:
    """A batch of sequences on kvquant's torch reference: one `_ReadBackLayerCache` each."""

    def __init__(self, sequences: list[_ReadBackLayerCache]) -> None:
        self._sequences = sequences

    def write(self, key: torch.Tensor, value: torch.Tensor, start: int) -> None:
        for b, sequence in enumerate(self._sequences):
            sequence.write(key[b], value[b], start)

    def attend(
        self,
        query: torch.Tensor,
        seq_len: int,
        softmax_scale: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        return torch.stack(
            [
                sequence.attend(query[b], seq_len, softmax_scale, sliding_window, softcap)
                for b, sequence in enumerate(self._sequences)
            ]
        )


@dataclass
class BatchKVSession:
    """The caches of one model for a batch of equally long sequences decoded together; every
    forward reads the cache it has just written (there is no fresh-prefill setting).

    Attributes:
        layers: one cache per decoder layer, indexed by the attention module's ``layer_idx``.
        batch: sequences in the batch.
        kernels: whether kvquant's kernels serve the caches (else its torch reference).
        length: tokens already in each sequence's cache; the next forward's start here.
    """

    layers: list[_BatchLayerCache]
    batch: int
    kernels: bool
    length: int = field(default=0)


def new_batch_session(
    *,
    kv_cache_dtype: str,
    model_dtype: torch.dtype,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    batch: int,
    max_tokens: int,
    device: torch.device,
    kernels: bool | None = None,
) -> BatchKVSession:
    """Allocate every layer's cache for ``batch`` sequences of up to ``max_tokens`` tokens.

    On the kernels every cache is a kvquant paged cache: the 16-bit one in the model dtype,
    INT8, or INT8 holding a control's codes; an fp8 cache, which kvquant does not page, is
    refused. On the reference path, the caches of `new_session`.
    """
    import kvquant

    layout, storage_dtype = cache_storage(kv_cache_dtype, model_dtype)
    use_kernels = _use_kernels(kernels, device, model_dtype)
    if use_kernels and layout == "dense":
        msg = f"`kv_cache_dtype` is {kv_cache_dtype!r}; kvquant's kernels page no such cache"
        raise AccuracyError(msg)
    bits = CONTROL_CACHE_BITS.get(kv_cache_dtype)
    layers: list[_BatchLayerCache] = []
    try:
        for _ in range(num_layers):
            if use_kernels:
                layers.append(
                    _BatchKernelCache(
                        storage_dtype, bits, batch, num_kv_heads, head_size, max_tokens, device
                    )
                )
                continue
            one = new_session(
                kv_cache_dtype=kv_cache_dtype,
                model_dtype=model_dtype,
                num_layers=batch,
                num_kv_heads=num_kv_heads,
                head_size=head_size,
                max_tokens=max_tokens,
                device=device,
                prefill_reads_cache=True,
                kernels=False,
            )
            sequences = [layer for layer in one.layers if isinstance(layer, _ReadBackLayerCache)]
            layers.append(_BatchReadBackCache(sequences))
    except kvquant.InvalidInputError as error:
        raise UnsupportedModelError(f"the model's KV cache: {error}") from None
    return BatchKVSession(layers=layers, batch=batch, kernels=use_kernels)


def _batch_attention(
    session: BatchKVSession,
    layer_idx: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    softmax_scale: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """`kvquant_attention` for a batch session: ``[batch, q_len, num_q_heads, head_size]``."""
    if query.shape[0] != session.batch:
        msg = f"`query` has batch {query.shape[0]}; the session holds {session.batch} sequences"
        raise AccuracyError(msg)
    q = query.transpose(1, 2)  # [batch, q_len, num_q_heads, head_size]
    k = key.transpose(1, 2).contiguous()
    v = value.transpose(1, 2).contiguous()
    cache = session.layers[layer_idx]
    start = session.length
    cache.write(k, v, start)
    out = cache.attend(q, start + q.shape[1], softmax_scale, sliding_window, softcap)
    return out.to(query.dtype)


def kvquant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (registered as ``kvquant``); one sequence per call.

    Args:
        query: ``[1, num_q_heads, q_len, head_size]`` after rotary embedding.
        key, value: ``[1, num_kv_heads, q_len, head_size]``, the new tokens only.
        attention_mask: unused: causality is positional and batches hold one sequence.

    Returns:
        ``([1, q_len, num_q_heads, head_size], None)``, as transformers expects.
    """
    session = kwargs.get("kv_session")
    if not isinstance(session, (KVSession, BatchKVSession)):
        msg = "`kv_session` is missing; the kvquant attention runs only inside KVQuantHFLM"
        raise AccuracyError(msg)
    layer_idx = getattr(module, "layer_idx", None)
    if not isinstance(layer_idx, int):
        raise AccuracyError("attention module has no integer `layer_idx`; cannot pick its cache")
    softmax_scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window")
    sliding_window = window if isinstance(window, int) else None
    cap = kwargs.get("softcap")
    softcap = float(cap) if isinstance(cap, (int, float)) else None
    if isinstance(session, BatchKVSession):
        out = _batch_attention(
            session, layer_idx, query, key, value, softmax_scale, sliding_window, softcap
        )
        return out, None
    if query.shape[0] != 1:
        msg = f"`query` has batch {query.shape[0]}; the kvquant attention takes one sequence"
        raise AccuracyError(msg)
    q = query[0].transpose(0, 1)  # [q_len, num_q_heads, head_size]
    k = key[0].transpose(0, 1).contiguous()  # [q_len, num_kv_heads, head_size]
    v = value[0].transpose(0, 1).contiguous()
    cache = session.layers[layer_idx]
    start = session.length
    cache.write(k, v, start)
    if start == 0 and q.shape[0] > 1 and not session.prefill_reads_cache:
        from kvquant.reference import attention_ref

        finite = bool(torch.isfinite(v).all())
        out = attention_ref(q, k, v, softmax_scale, sliding_window, softcap, values_finite=finite)
    else:
        out = cache.attend(q, start + q.shape[0], softmax_scale, sliding_window, softcap)
    return out.to(query.dtype)[None], None


def register_attention() -> None:
    """Make ``attn_implementation="kvquant"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, kvquant_attention)
