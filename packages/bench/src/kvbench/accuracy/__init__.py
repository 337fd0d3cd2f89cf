"""Accuracy of a 16-bit against an INT8 KV cache: paired lm-eval comparisons on a real model.

`run_accuracy` runs the configured tasks twice per mode (baseline and INT8 cache) through the
lm-eval model ``kvquant-hf``, or lm-eval's own ``vllm`` model given each cache as its
``kv_cache_dtype``, and returns per-task paired statistics with the config's gate and each row's
verdict (passed, inconclusive or failed); its divergence runs compare the caches' next-token
distributions on running text, with two controls, without lm-eval.
Importing this package stays light; lm-eval, transformers and torch load on first use.
"""

from __future__ import annotations

from ._errors import (
    AccuracyError,
    BackendMissingError,
    ConfigError,
    EngineStartError,
    ModelLoadError,
    OutputError,
    UnknownTaskError,
    UnsupportedModelError,
)
from ._result import AccuracyResult, DivergenceResult
from ._run import run_accuracy
from ._stats import (
    PairedStats,
    detectable_delta,
    flip_rate_upper_bound,
    gate_passes,
    mcnemar_exact,
    paired_stats,
    verdict,
)

__all__ = [
    "AccuracyError",
    "AccuracyResult",
    "BackendMissingError",
    "ConfigError",
    "DivergenceResult",
    "EngineStartError",
    "ModelLoadError",
    "OutputError",
    "PairedStats",
    "UnknownTaskError",
    "UnsupportedModelError",
    "detectable_delta",
    "flip_rate_upper_bound",
    "gate_passes",
    "mcnemar_exact",
    "paired_stats",
    "run_accuracy",
    "verdict",
]
