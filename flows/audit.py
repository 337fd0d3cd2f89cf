"""Stage `audit`: is the vendor fork upstream vLLM, or does it carry surprise patches?

forkaudit's report gives the record (`forkaudit.record_parts`): codes and figures, never its
English sentences, so that the ADR writer can say them in each ADR's language. Fills ADR 0012's
audit blocks. The audit checks the upstream symbols kvquant's vLLM plugin relies on, as the
plugin declares them (`kvquant.vllm_plugin.UPSTREAM_HOOKS_FILE`), in the fork's source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Task, flow, task
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

import forkaudit
from adrkit.schema import Record, RecordParts
from flows._stage import RunContext, run_stage
from kvquant.vllm_plugin import UPSTREAM_HOOKS_FILE

STAGE = "audit"


def _fetch_failed(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only a failed download: a bad ref or a corrupt repository fails the same way again."""
    try:
        state.result()
    except forkaudit.FetchError:
        return True
    except Exception:  # any other failure is final; the stage records it
        return False
    return False


@task(retries=2, retry_delay_seconds=[10, 60], retry_condition_fn=_fetch_failed)
def diff_fork(
    fork: str | None,
    upstream: str | None,
    scope: str | None,
    cache_dir: Path | None,
    hooks: Path | None,
    hooks_version: str | None,
) -> forkaudit.AuditReport:
    """Fetch both sides (from the package index, for pypi specs) and diff them; a side left out
    is the one forkaudit's rules pin. Check the plugin hooks ``hooks`` declares, for the
    release the fork reports or ``hooks_version``."""
    return forkaudit.diff(
        fork,
        upstream,
        scope=scope,
        cache_dir=cache_dir,
        hooks=hooks,
        hooks_version=hooks_version,
    )


def audit_parts(report: forkaudit.AuditReport, out_dir: Path) -> RecordParts:
    """The record of ``report``, whose JSON, English report and patch are written first."""
    return forkaudit.record_parts(report, forkaudit.write_reports(report, out_dir))


@flow(name="audit", flow_run_name="audit-{run_id}", log_prints=True)
def audit_stage(
    run_id: str,
    results_root: Path,
    fork: str | None = None,
    upstream: str | None = None,
    scope: str | None = forkaudit.DEFAULT_SCOPE,
    cache_dir: Path | None = None,
    flow_run_id: str | None = None,
    hooks: str | None = str(UPSTREAM_HOOKS_FILE),
    hooks_version: str | None = None,
) -> Record:
    """Diff the vendor fork against upstream, judge whether it hides vendor patches, and
    whether it still offers every hook the plugin relies on (``hooks``: a hooks file; None
    checks none, which the stage's gate fails)."""
    hooks_file = Path(hooks) if hooks is not None else None
    return run_stage(
        STAGE,
        RunContext(run_id, Path(results_root), flow_run_id),
        lambda out_dir: audit_parts(
            diff_fork(fork, upstream, scope, cache_dir, hooks_file, hooks_version), out_dir
        ),
        title="Vendor fork audit",
        table="findings",
        gpu=False,
    )
