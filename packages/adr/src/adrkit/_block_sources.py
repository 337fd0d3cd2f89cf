"""What each generated block of a stage reads: the stage, the tables of its record and the figures
(PNG artifacts) it embeds.

The renderers take their stage, table and figures from `BLOCK_SOURCES`, the decision summaries'
answers and the per-hardware notes the stage and table of the block that shows what they read,
and the pipeline holds
the stages to it before any of them runs (`missing_tables`) and each record to it as it is made
(`check_records`): a table that a block reads and its stage no longer records is one line naming
the block, the stage and the table, instead of a block that silently shows no rows. Figures are
declared, not required: a plot is drawn only when there is something to plot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from adrkit.schema import Record, RecordError


@dataclass(frozen=True)
class BlockSource:
    """The stage a block shows, the tables of its record it reads, and the figures it embeds."""

    stage: str
    tables: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()

    @property
    def table(self) -> str:
        """The one table the block shows; a block shows at most one."""
        (table,) = self.tables
        return table


BLOCK_SOURCES: dict[str, BlockSource] = {
    "audit-summary": BlockSource("audit"),
    "audit-questions": BlockSource("audit", ("questions",)),
    "audit-findings": BlockSource("audit", ("findings",)),
    "audit-changes": BlockSource("audit", ("changes",)),
    "audit-left-out": BlockSource("audit", ("left-out",)),
    "audit-hooks": BlockSource("audit", ("hooks",)),
    "kvquant-correctness": BlockSource("correctness", ("errors",)),
    "kvquant-edge-cases": BlockSource("correctness", ("edge-cases",)),
    "kvquant-resources": BlockSource("kernels", ("resources",)),
    "kvquant-resource-diff": BlockSource("kernels", ("resource-diff",)),
    "kvquant-specializations": BlockSource("kernels", ("specializations",)),
    "kvbench-accuracy": BlockSource("accuracy", ("deltas",), ("accuracy_deltas.png",)),
    "kvbench-divergence": BlockSource("accuracy", ("divergence",), ("divergence_kld.png",)),
    "kvbench-kernel-throughput": BlockSource(
        "throughput",
        ("kernels",),
        ("throughput-kernel-vs-context.png", "throughput-kernel-vs-batch.png"),
    ),
    "kvbench-served-step": BlockSource("throughput", ("served_steps",)),
    "kvbench-capacity": BlockSource("throughput", ("capacity",)),
    "kvbench-e2e": BlockSource(
        "throughput",
        ("e2e",),
        (
            "throughput-e2e-vs-batch.png",
            "throughput-e2e-vs-input_len.png",
            "throughput-trend.png",
        ),
    ),
}


def missing_tables(tables_by_stage: Mapping[str, Collection[str]]) -> list[str]:
    """One line for each table a block reads that its stage, one of ``tables_by_stage``, does
    not have; stages not given are not judged."""
    problems = []
    for key, source in BLOCK_SOURCES.items():
        tables = tables_by_stage.get(source.stage)
        if tables is None:
            continue
        for table in source.tables:
            if table not in tables:
                has = ", ".join(f"`{name}`" for name in sorted(tables)) or "none"
                problems.append(
                    f"block `{key}` reads table `{table}` of stage `{source.stage}`, which is "
                    f"not among its tables ({has})"
                )
    return problems


def check_records(records: Iterable[Record]) -> None:
    """Raise a one-line `RecordError` naming every block, stage and table that ``records``
    lack. A record without results (skipped, or failed before it had any table) is not
    judged: its blocks show its reason."""
    problems = [
        problem
        for record in records
        if record.status != "skipped" and (record.tables or record.status == "passed")
        for problem in missing_tables({record.stage: record.tables.keys()})
    ]
    if problems:
        raise RecordError("; ".join(problems))
