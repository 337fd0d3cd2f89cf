"""What every stage flow shares: the run it belongs to, and how its record is built and shown."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.concurrency.sync import concurrency

from adrkit import (
    Gate,
    Provenance,
    Record,
    RecordError,
    Scalar,
    Table,
    hardware,
    markdown_table,
    package_versions,
    repo_state,
    utc_now,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GATES_FILE = REPO_ROOT / "flows" / "gates.toml"
# Versions recorded with every record, so a figure can be tied to the code that produced it.
PROVENANCE_PACKAGES = ["adrkit", "forkaudit", "kvquant", "kvbench", "prefect", "torch", "triton"]


@dataclass(frozen=True)
class RunContext:
    """The pipeline run a stage belongs to."""

    run_id: str
    results_root: Path
    flow_run_id: str | None = None

    def stage_dir(self, stage: str) -> Path:
        """Where a stage keeps its artifacts: beside the records of its run."""
        path = self.results_root / self.run_id / stage
        path.mkdir(parents=True, exist_ok=True)
        return path


def build_record(
    ctx: RunContext,
    stage: str,
    started_at: str,
    *,
    summary: str,
    metrics: dict[str, Scalar],
    tables: dict[str, Table] | None = None,
    gates: list[Gate] | None = None,
    artifacts: dict[str, str] | None = None,
    fork_commit: str | None = None,
    fork_tree: str | None = None,
) -> Record:
    """A record whose status follows its gates, ``gates`` and those of gates.toml for ``stage``:
    a failed gate fails the stage, with the reason."""
    gates = [*(gates or []), *stage_gates(stage, metrics)]
    failed = [g for g in gates if not g.passed]
    reason = "; ".join(f"gate {g.name}: {g.value:g} not {g.op} {g.threshold:g}" for g in failed)
    return Record(
        stage=stage,
        status="failed" if failed else "passed",
        reason=reason or None,
        summary=summary,
        metrics=metrics,
        tables=tables or {},
        gates=gates,
        artifacts=artifacts or {},
        provenance=_provenance(ctx, started_at, fork_commit, fork_tree),
    )


class GatesFileError(ValueError):
    """Raised when gates.toml is malformed or names a metric its stage does not record."""


def load_gates(
    gates_file: Path = GATES_FILE, known_stages: Collection[str] | None = None
) -> dict[str, dict[str, tuple[str, float]]]:
    """gates.toml, checked whole: {stage: {metric: (op, threshold)}}.

    With ``known_stages``, a section for any other stage is an error: a misspelt stage would
    otherwise run with no gates at all.
    """
    try:
        data = tomllib.loads(gates_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise GatesFileError(f"{gates_file}: {error}") from None
    gates: dict[str, dict[str, tuple[str, float]]] = {}
    for stage, declared in data.items():
        if known_stages is not None and stage not in known_stages:
            known = ", ".join(known_stages)
            raise GatesFileError(f"{gates_file}: [{stage}] is not a stage; expected one of {known}")
        if not isinstance(declared, dict):
            raise GatesFileError(f"{gates_file}: {stage} must be a table [{stage}] of gates")
        gates[stage] = {}
        for metric, rule in declared.items():
            where = f"{gates_file}: [{stage}] {metric}"
            if not isinstance(rule, dict) or set(rule) != {"op", "threshold"}:
                raise GatesFileError(f"{where} must be a table {{ op = ..., threshold = ... }}")
            op, threshold = str(rule["op"]), rule["threshold"]
            if isinstance(threshold, bool) or not isinstance(threshold, int | float):
                raise GatesFileError(f"{where}: threshold {threshold!r} is not a number")
            if not math.isfinite(threshold):
                raise GatesFileError(f"{where}: threshold {threshold!r} is not finite")
            try:
                Gate.judge(metric, 0.0, op, float(threshold))
            except RecordError as error:  # an unknown comparison
                raise GatesFileError(f"{gates_file}: [{stage}] {error}") from None
            gates[stage][metric] = (op, float(threshold))
    return gates


def stage_gates(
    stage: str, metrics: dict[str, Scalar], gates_file: Path = GATES_FILE
) -> list[Gate]:
    """The gates ``gates_file`` declares for ``stage``, each judged on its metric."""
    gates = []
    for metric, (op, threshold) in load_gates(gates_file).get(stage, {}).items():
        value = metrics.get(metric)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GatesFileError(
                f"{gates_file}: [{stage}] {metric}: the stage records no numeric metric {metric!r}"
            )
        gates.append(Gate.judge(metric, float(value), op, threshold))
    return gates


def failed_record(ctx: RunContext, stage: str, started_at: str, reason: str) -> Record:
    """The record of a stage that could not produce a result."""
    return _bare_record(ctx, stage, started_at, "failed", reason)


def skipped_record(ctx: RunContext, stage: str, reason: str) -> Record:
    return _bare_record(ctx, stage, utc_now(), "skipped", reason)


def _bare_record(ctx: RunContext, stage: str, started_at: str, status: str, reason: str) -> Record:
    return Record(
        stage=stage,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        summary=reason,
        provenance=_provenance(ctx, started_at),
    )


def accelerator() -> dict[str, Scalar]:
    """The GPU this process sees, if any: its name and architecture (``gfx90a`` on ROCm, from
    its gcnArchName; ``sm_90`` on CUDA), which make a record's hardware class."""
    try:
        import torch
    except ImportError:
        return {"accelerator": None, "accelerator_arch": None}
    if not torch.cuda.is_available():
        return {"accelerator": None, "accelerator_arch": None}
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    if torch.version.hip:  # e.g. "gfx90a:sramecc+:xnack-": the target and its feature flags
        arch = str(properties.gcnArchName).split(":")[0]
    else:
        arch = f"sm_{properties.major}{properties.minor}"
    return {"accelerator": properties.name, "accelerator_arch": arch}


def _provenance(
    ctx: RunContext, started_at: str, fork_commit: str | None = None, fork_tree: str | None = None
) -> Provenance:
    """Where a record of this run comes from; it ends now."""
    commit, dirty = repo_state(REPO_ROOT)
    return Provenance(
        run_id=ctx.run_id,
        started_at=started_at,
        ended_at=utc_now(),
        repo_commit=commit,
        repo_dirty=dirty,
        fork_commit=fork_commit,
        fork_tree=fork_tree,
        flow_run_id=ctx.flow_run_id,
        packages=package_versions(PROVENANCE_PACKAGES),
        hardware=hardware() | accelerator(),
    )


def tables_markdown(record: Record, title: str) -> str:
    """A stage report made of the record's summary and tables, for stages with no report of
    their own."""
    parts = [f"# {title}", record.summary]
    for name, table in record.tables.items():
        parts += [f"## {name}", markdown_table("en", table.columns, table.rows)]
    return "\n\n".join(parts) + "\n"


# Set on each GPU node's worker (infra/systemd): the name of the Prefect global concurrency limit,
# of 1, that stands for one GPU. Unset on a laptop, where nothing else shares the GPU.
GPU_SLOT_ENV = "KVCACHE_GPU_SLOT"


@contextmanager
def gpu_slot() -> Iterator[None]:
    """Hold this worker's GPU for a whole GPU stage, so two benchmarks never share one GPU.

    strict: a slot named in the worker's environment but not created on the server is a setup
    error, not a reason to run unguarded.
    """
    name = os.environ.get(GPU_SLOT_ENV)
    if not name:
        yield
        return
    with concurrency(name, occupy=1, strict=True):
        yield


def publish(record: Record, markdown: str, table: str) -> None:
    """Publish the stage's report and its main table as keyed artifacts: one history per key."""
    create_markdown_artifact(
        key=f"{record.stage}-report", markdown=markdown, description=record.summary[:500]
    )
    found = record.tables.get(table)
    rows = [dict(zip(found.columns, row, strict=True)) for row in found.rows] if found else []
    create_table_artifact(
        key=f"{record.stage}-{table}",
        table=rows or [{"result": record.summary}],
        description=f"{record.stage}: {table}",
    )
