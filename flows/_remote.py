"""Run a stage as a deployment on another work pool (a GPU node) and wait for its record.

The stage flow on the GPU node writes its record under the shared results location that the
pipeline passes it (`results_root`, declared in config); the pipeline reads it back from there.
No copy is made by hand, and nothing depends on the two flows sharing a process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import Cancelled

POLL_S = 2.0


@dataclass(frozen=True)
class RemoteOutcome:
    """How a stage submitted to a pool ended: `ran` with its final state, or never picked up."""

    flow_run_id: str
    ran: bool
    completed: bool
    message: str


def run_on_pool(
    stage: str,
    pool: str,
    parameters: dict[str, Any],
    *,
    pickup_timeout_s: float,
    timeout_s: float,
) -> RemoteOutcome:
    """Submit `<stage>/<pool>` and wait. A run no worker takes within `pickup_timeout_s` is
    cancelled and reported as not run, so a missing GPU node never hangs the nightly."""
    flow_run = run_deployment(f"{stage}/{pool}", parameters=parameters, timeout=0)
    run_id = str(flow_run.id)
    started = time.monotonic()
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(flow_run.id).state
            waited = time.monotonic() - started
            if state is not None and state.is_final():
                return RemoteOutcome(run_id, True, state.is_completed(), str(state.message or ""))
            if state is not None and state.is_scheduled() and waited > pickup_timeout_s:
                reason = (
                    f"not run: no worker on pool {pool!r} took the {stage} run within "
                    f"{pickup_timeout_s:g} s"
                )
                client.set_flow_run_state(flow_run.id, Cancelled(message=reason), force=True)
                return RemoteOutcome(run_id, False, False, reason)
            if waited > pickup_timeout_s + timeout_s:
                reason = f"{stage} on pool {pool!r} did not finish within {timeout_s:g} s"
                client.set_flow_run_state(flow_run.id, Cancelled(message=reason), force=True)
                return RemoteOutcome(run_id, True, False, reason)
            time.sleep(POLL_S)
