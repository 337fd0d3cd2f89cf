"""The renderer of every stage block, by block key: the fork audit's (`adrkit._audit_blocks`),
then the kernel build's, correctness', accuracy's and throughput's, each of which shows the one
table its stage's record holds for it as recorded, a check's own words quoted as code. A renderer
reads records only, never a package, so a block shows exactly what a stage recorded, and every
block ends with the run id and the commit of each record it used.
"""

from __future__ import annotations

from adrkit._audit_blocks import AUDIT_BLOCKS
from adrkit._kernel_blocks import KERNEL_BLOCKS
from adrkit._stage_renderer import Renderer, render_record_table
from adrkit._throughput_blocks import THROUGHPUT_BLOCKS

BLOCKS: dict[str, Renderer] = {
    **AUDIT_BLOCKS,
    **KERNEL_BLOCKS,
    **THROUGHPUT_BLOCKS,
    "kvquant-correctness": render_record_table(
        "kvquant-correctness", "no-cases", verbatim=frozenset({"verdict"})
    ),
    "kvquant-edge-cases": render_record_table(
        "kvquant-edge-cases", "no-cases", verbatim=frozenset({"detail"})
    ),
    "kvquant-resource-diff": render_record_table(
        "kvquant-resource-diff", "no-diff", no_baseline_key="no-previous-build"
    ),
    "kvbench-accuracy": render_record_table("kvbench-accuracy", "no-rows"),
    "kvbench-divergence": render_record_table("kvbench-divergence", "no-rows"),
    "kvbench-capacity": render_record_table("kvbench-capacity", "no-rows"),
    "kvbench-e2e": render_record_table("kvbench-e2e", "no-rows", verbatim=frozenset({"verdict"})),
}
