"""Causal varlen (chunked) prefill over the paged INT8 or 16-bit cache.

- `kernels`: the Triton prefill kernel, its launch shapes (`PrefillConfig`) and `prefill_spec`/
  `aot_specs`, what it compiles;
- `workspace`: an INT8 cache's fp16 workspace: the kernels that expand pages into it and the
  memory they expand into (`PrefillScratch`), sized once;
- `plan`: a batch's layout, made on the host once (`plan_prefill_step`, which an engine step's
  layers share), and the checked one-call plan (`plan_prefill`);
- `attention`: `prefill_attention`, one checked call.
"""

from .attention import prefill_attention
from .kernels import PrefillConfig, aot_specs, prefill_config, prefill_spec
from .plan import PrefillPlan, PrefillStepPlan, plan_prefill, plan_prefill_step
from .workspace import WORKSPACE_LIMIT_BYTES, PrefillScratch, engine_pages, workspace_page_bytes

__all__ = [
    "WORKSPACE_LIMIT_BYTES",
    "PrefillConfig",
    "PrefillPlan",
    "PrefillScratch",
    "PrefillStepPlan",
    "aot_specs",
    "engine_pages",
    "plan_prefill",
    "plan_prefill_step",
    "prefill_attention",
    "prefill_config",
    "prefill_spec",
    "workspace_page_bytes",
]
