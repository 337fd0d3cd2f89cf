"""What every stage flow shares: the run it belongs to, and the skeleton that holds the GPU,
turns a package's result into the stage's record, writes it and shows it.

A stage flow only calls its package: the package's result gives the parts of the record
(`adrkit.schema`'s `RecordParts`: summary, metrics, tables, its own gates' verdicts and the files it
wrote), and `run_stage` does the rest, the same way for every stage.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.concurrency.sync import concurrency

from adrkit import (
    check_records,
    hardware,
    load_sources,
    markdown_table,
    package_versions,
    repo_state,
    utc_now,
    write_record,
)
from adrkit.schema import Gate, Provenance, Record, RecordError, RecordParts, Scalar, gate_rule

REPO_ROOT = Path(__file__).resolve().parents[1]
GATES_FILE = REPO_ROOT / "flows" / "gates.toml"
# Declares the source files of each stage, whose hashes every record carries (adrkit's freshness).
ADR_DIR = REPO_ROOT / "docs" / "adr"
# Versions recorded with every record, so a figure can be tied to the code that produced it.
PROVENANCE_PACKAGES = [
    "adrkit",
    "forkaudit",
    "kvquant",
    "kvbench",
    "prefect",
    "torch",
    "triton",
]


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


def stage_record(ctx: RunContext, stage: str, started_at: str, parts: RecordParts) -> Record:
    """The record of ``parts``, whose status follows its gates, the package's and those of
    gates.toml for ``stage``: a failed gate fails the stage, with the reason. So does a table
    that an ADR block reads from the stage and the parts lack (`adrkit.check_records`).

    Each package gate was judged as it was built (`adrkit.schema`'s `Gate`), so a verdict that
    disagrees with its figures is an error before it gets here.
    """
    metrics = dict(parts.metrics)
    gates = [*parts.gates, *stage_gates(stage, metrics)]
    failed = [g for g in gates if not g.passed]
    reason = "; ".join(f"gate {g.name}: {g.value:g} not {g.op} {g.threshold:g}" for g in failed)
    # The audit names the fork it read among its metrics; its provenance names it too.
    fork_commit, fork_tree = (metrics.get(k) for k in ("fork_commit", "fork_tree"))
    record = Record(
        stage=stage,
        status="failed" if failed else "passed",
        reason=reason or None,
        summary=parts.summary,
        metrics=metrics,
        tables=dict(parts.tables),
        gates=gates,
        artifacts=dict(parts.artifacts),
        provenance=_provenance(
            ctx,
            stage,
            started_at,
            fork_commit if isinstance(fork_commit, str) else None,
            fork_tree if isinstance(fork_tree, str) else None,
        ),
    )
    try:
        check_records([record])
    except RecordError as error:
        reasons = [str(error), *([record.reason] if record.reason else [])]
        record = dataclasses.replace(record, status="failed", reason="; ".join(reasons))
    return record


# A stage whose package wrote a report of its own (an artifact of this name) publishes it; the
# others publish their record's summary and tables.
REPORT_ARTIFACT = "report.md"


def run_stage(
    stage: str,
    ctx: RunContext,
    produce: Callable[[Path], RecordParts],
    *,
    title: str,
    table: str,
    gpu: bool,
    not_run: tuple[type[Exception], ...] = (),
) -> Record:
    """Every stage flow's skeleton: hold this worker's GPU for a ``gpu`` stage; call
    ``produce`` with the stage's folder for its record's parts (an error of ``not_run``, such
    as a missing engine, makes the record a skipped one); write the record; publish its report
    under ``title`` and its ``table``. Any other error propagates: the pipeline records the
    crash."""
    with gpu_slot() if gpu else nullcontext():
        started_at = utc_now()
        try:
            parts = produce(ctx.stage_dir(stage))
        except not_run as error:
            record = skipped_record(ctx, stage, f"not run: {error}")
        else:
            record = stage_record(ctx, stage, started_at, parts)
    write_record(ctx.results_root, record)
    report = record.artifacts.get(REPORT_ARTIFACT)
    if report is None:
        publish(record, tables_markdown(record, title), table)
    else:
        publish(record, Path(report).read_text(encoding="utf-8"), table)
    return record


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
            try:
                gates[stage][metric] = gate_rule(metric, rule)
            except RecordError as error:
                raise GatesFileError(f"{gates_file}: [{stage}] {metric}: {error}") from None
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
        provenance=_provenance(ctx, stage, started_at),
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
    ctx: RunContext,
    stage: str,
    started_at: str,
    fork_commit: str | None = None,
    fork_tree: str | None = None,
) -> Provenance:
    """Where a record of this run comes from, with the hashes of the source files its stage
    measured (docs/adr/sources.toml); it ends now."""
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
        sources=load_sources(ADR_DIR).hashes(stage) or {},
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
