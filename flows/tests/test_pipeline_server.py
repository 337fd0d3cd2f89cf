"""The pipeline deployed from flows/prefect.yaml and run by a worker on a real Prefect server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adrkit import load_latest

from conftest import ForkFixture, PrefectServer, create_pools, deploy_all

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WORKER_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def deployed(prefect_server: PrefectServer) -> PrefectServer:
    """The work pools and every deployment from flows/prefect.yaml."""
    create_pools(prefect_server)
    deploy_all(prefect_server)
    return prefect_server


def _run_deployment(
    server: PrefectServer, name: str, params: dict[str, object]
) -> dict[str, object]:
    """Create a run of `name`, let one worker execute it, and return the flow run from the API."""
    started = server.cli("deployment", "run", name, "--params", json.dumps(params))
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = UUID.search(started.stdout)
    assert flow_run_id, started.stdout
    worker = server.cli("worker", "start", "--pool", "cpu", "--run-once", timeout=WORKER_TIMEOUT_S)
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]
    flow_run = server.api("GET", f"/flow_runs/{flow_run_id.group(0)}")
    assert isinstance(flow_run, dict)
    return flow_run


def _params(fork: ForkFixture, adr_dir: Path, results: Path) -> dict[str, object]:
    return {
        "fork": fork.fork,
        "upstream": fork.upstream,
        "scope": None,
        "adr_dir": str(adr_dir),
        "results_root": str(results),
        # Every stage in the worker's own process: these tests start no GPU-pool worker.
        "pools": {},
    }


def test_nightly_deployment_runs_audit_and_writes_adrs(
    deployed: PrefectServer, small_fork: ForkFixture, adr_copy: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    flow_run = _run_deployment(deployed, "pipeline/nightly", _params(small_fork, adr_copy, results))
    state = flow_run["state"]
    assert isinstance(state, dict)
    assert state["type"] == "COMPLETED", state

    record = load_latest(results)["audit"]
    assert record.provenance.flow_run_id == flow_run["id"]
    assert record.metrics["files_modified"] == 2
    # The fork's patch touches env vars and an attention backend: a gate failure, recorded.
    assert record.status == "failed"
    assert not record.gates_passed

    audit_adr = (adr_copy / "0012-vendor-fork-audit.md").read_text()
    for key in ("audit-summary", "audit-findings"):
        body = audit_adr.split(f"<!-- generated:{key} begin -->")[1].split("<!-- generated:")[0]
        assert str(flow_run["id"]) in body, key
    assert "vllm/envs.py" in audit_adr
    status_adr = (adr_copy / "0001-record-architecture-decisions.md").read_text()
    assert f"流程运行 `{flow_run['id']}`" in status_adr

    artifacts = deployed.api(
        "POST",
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["audit-report", "audit-findings", "adr-update"]}}},
    )
    assert isinstance(artifacts, list)
    assert {a["key"] for a in artifacts} == {"audit-report", "audit-findings", "adr-update"}


def test_milestone_deployment_fails_on_a_failed_gate_after_writing_adrs(
    deployed: PrefectServer, small_fork: ForkFixture, adr_copy: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    params = _params(small_fork, adr_copy, results) | {"milestone": "m1", "stages": ["audit"]}
    flow_run = _run_deployment(deployed, "pipeline/milestone", params)
    state = flow_run["state"]
    assert isinstance(state, dict)
    assert state["type"] == "FAILED", state
    assert "gate vendor_risk_changes" in str(state["message"])
    audit_adr = (adr_copy / "0012-vendor-fork-audit.md").read_text()
    assert str(flow_run["id"]) in audit_adr


def test_nightly_records_a_crashed_stage_and_runs_the_others(
    deployed: PrefectServer, small_fork: ForkFixture, adr_copy: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    missing = ForkFixture(fork=str(tmp_path / "no-such-fork"), upstream=small_fork.upstream)
    flow_run = _run_deployment(deployed, "pipeline/nightly", _params(missing, adr_copy, results))
    state = flow_run["state"]
    assert isinstance(state, dict)
    assert state["type"] == "COMPLETED", state

    records = load_latest(results)
    assert records["audit"].status == "failed"
    assert "no-such-fork" in str(records["audit"].reason)
    assert "\n" not in str(records["audit"].reason)
    assert records["correctness"].status == "passed"
    status_adr = (adr_copy / "0001-record-architecture-decisions.md").read_text()
    assert "| audit | 失败 |" in status_adr
    assert "| correctness | 通过 |" in status_adr


def test_a_gpu_stage_with_no_worker_is_reported_not_run(
    deployed: PrefectServer, small_fork: ForkFixture, adr_copy: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    params = _params(small_fork, adr_copy, results) | {
        "stages": ["correctness"],
        "pools": {"correctness": "gfx90a"},
        "pickup_timeout_s": 5,
    }
    flow_run = _run_deployment(deployed, "pipeline/nightly", params)
    state = flow_run["state"]
    assert isinstance(state, dict)
    assert state["type"] == "COMPLETED", state
    record = load_latest(results)["correctness"]
    assert record.status == "skipped"
    assert record.reason == (
        "not run: no worker on pool 'gfx90a' took the correctness run within 5 s"
    )
    status_adr = (adr_copy / "0001-record-architecture-decisions.md").read_text()
    assert "| correctness | 跳过 | not run: no worker on pool 'gfx90a'" in status_adr
