"""Paged decode attention over the INT8 or 16-bit cache: one new query token per sequence.

- `kernels`: the Triton decode kernel and `decode_spec`/`aot_specs`, what it compiles;
- `config`: its launch shapes (`DecodeConfig`, `decode_config`);
- `reduce`: the split-KV reducer, which combines a split decode's partial results;
- `splits`: how many splits a batch takes (a cost model, no device);
- `plan`: `DecodePlan`, one launch fixed per batch size and longest context (`plan_decode`);
- `attention`: `decode_attention`, one checked call through the plan of its shapes.
"""

from .attention import decode_attention
from .config import DecodeConfig, decode_config
from .kernels import aot_specs, decode_spec
from .plan import DecodePlan, clear_plan_caches, plan_decode

__all__ = [
    "DecodeConfig",
    "DecodePlan",
    "aot_specs",
    "clear_plan_caches",
    "decode_attention",
    "decode_config",
    "decode_spec",
    "plan_decode",
]
