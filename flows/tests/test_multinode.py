"""The multi-node setup without docker: Prefect on PostgreSQL, a CPU and a GPU pool with one
worker each, a global concurrency limit for the GPU, and two pipeline runs at once."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adrkit import read_record

from conftest import (
    ForkFixture,
    PrefectServer,
    create_pools,
    deploy_all,
    running_prefect_server,
    start_worker,
    stop_process_group,
)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
GPU_SLOT = "gpu-test-0"
RUN_TIMEOUT_S = 900  # an upper bound: CI runs the vllm session beside these tests


@pytest.fixture(scope="module")
def cluster(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """Prefect on PostgreSQL with the pools, the GPU's concurrency limit, and the deployments."""
    home = tmp_path_factory.mktemp("prefect-pg-home")
    with running_prefect_server(home, postgres_url) as server:
        create_pools(server)
        limit = server.cli("global-concurrency-limit", "create", GPU_SLOT, "--limit", "1")
        assert limit.returncode == 0, limit.stdout + limit.stderr
        deploy_all(server)
        yield server


def _flow_runs(server: PrefectServer, **filters: object) -> list[dict[str, object]]:
    runs = server.api("POST", "/flow_runs/filter", filters)
    assert isinstance(runs, list)
    return runs


def test_two_runs_share_one_gpu_in_turn_and_write_adrs_on_cpu(
    cluster: PrefectServer,
    small_fork: ForkFixture,
    adr_copy: Path,
    tmp_path: Path,
    tiny_kernel_matrix: Path,
) -> None:
    # audit and the ADRs on the CPU pool; correctness (which needs no GPU here) on the GPU pool.
    results = tmp_path / "shared-results"  # the shared results location both pools can see
    workers = [
        start_worker(cluster, "cpu", tmp_path / "cpu-worker.log"),
        start_worker(cluster, "cuda", tmp_path / "gpu-worker.log", KVCACHE_GPU_SLOT=GPU_SLOT),
    ]
    try:
        params = {
            "fork": small_fork.fork,
            "upstream": small_fork.upstream,
            "scope": None,
            "adr_dir": str(adr_copy),
            "results_root": str(results),
            "stages": ["audit", "kernels", "correctness"],
            # One small kernel cell: what is under test is where stages run, not the build.
            "kernel_matrix": str(tiny_kernel_matrix),
            "kernel_targets": ["gfx90a"],
            "pools": {"correctness": "cuda"},
            "pickup_timeout_s": 120,
        }
        started = [
            cluster.cli("deployment", "run", "pipeline/nightly", "--params", json.dumps(params))
            for _ in range(2)
        ]
        assert all(s.returncode == 0 for s in started), [s.stderr for s in started]
        # By id: only this test's two runs are under test.
        run_ids = [match.group(0) for s in started if (match := UUID.search(s.stdout))]
        assert len(run_ids) == 2, [s.stdout for s in started]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            pipelines = _flow_runs(cluster, flow_runs={"id": {"any_": run_ids}})
            if len(pipelines) == 2 and all(
                run["state"]["type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}  # type: ignore[index]
                for run in pipelines
            ):
                break
            assert time.monotonic() < deadline, [r["state"] for r in pipelines]
            time.sleep(2)
    finally:
        for worker in workers:
            stop_process_group(worker)

    assert [r["state"]["type"] for r in pipelines] == ["COMPLETED", "COMPLETED"]  # type: ignore[index]
    assert {r["work_pool_name"] for r in pipelines} == {"cpu"}
    stage_runs = _flow_runs(cluster, flows={"name": {"any_": ["correctness"]}})
    assert [r["work_pool_name"] for r in stage_runs] == ["cuda", "cuda"]
    assert {r["state"]["type"] for r in stage_runs} == {"COMPLETED"}  # type: ignore[index]

    # The GPU slot held: the two correctness stages ran one after the other, not together.
    records = sorted(
        (read_record(path) for path in results.glob("*/correctness.json")),
        key=lambda record: record.provenance.started_at,
    )
    assert len(records) == 2
    assert records[0].provenance.ended_at <= records[1].provenance.started_at

    # The ADRs were written on the CPU pool, once per pipeline run, never by a GPU stage.
    for run in pipelines + stage_runs:
        artifacts = cluster.api(
            "POST",
            "/artifacts/filter",
            {
                "artifacts": {"key": {"any_": ["adr-update"]}},
                "flow_runs": {"id": {"any_": [run["id"]]}},
            },
        )
        assert isinstance(artifacts, list)
        assert len(artifacts) == (1 if run in pipelines else 0)
    assert (
        str(pipelines[0]["id"]) in (adr_copy / "0009-int8-kv-cache-quantization.md").read_text()
        or str(pipelines[1]["id"]) in (adr_copy / "0009-int8-kv-cache-quantization.md").read_text()
    )
