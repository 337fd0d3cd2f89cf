"""A worker killed mid-run: the server marks the flow run Crashed once its heartbeats stop (the
automation in infra/automations.yaml), and a rerun completes and writes each ADR block once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from adrkit._writer import lock_for

from conftest import (
    REPO_ROOT,
    ForkFixture,
    PrefectServer,
    create_pools,
    deploy_all,
    running_prefect_server,
    start_worker,
)

AUTOMATIONS = REPO_ROOT / "infra" / "automations.yaml"
AUTOMATION = "crash-silent-flow-runs"
# Prefect's smallest heartbeat interval; infra/automations.yaml's window is set against it.
HEARTBEAT_S = "30"
# The server evaluates proactive triggers every 5 s; events reach it within a second or two.
CRASH_SLACK_S = 30
RUN_TIMEOUT_S = 300
MARKER = re.compile(r"<!-- generated:(\S+) (begin|end) -->")
T = TypeVar("T")


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A server of its own: the automation crashes any deployment run silent for a minute, and
    the other tests' workers beat at Prefect's default of every 180 s."""
    home = tmp_path_factory.mktemp("prefect-crash-home")
    with running_prefect_server(home, f"sqlite+aiosqlite:///{home / 'prefect.db'}") as server:
        # Applied twice, as a deploy script would on every deploy: the second run updates.
        for _ in range(2):
            applied = subprocess.run(
                [sys.executable, str(REPO_ROOT / "infra" / "apply_automations.py")],
                env=server.env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert applied.returncode == 0, applied.stdout + applied.stderr
        automations = server.api("POST", "/automations/filter", {})
        assert isinstance(automations, list)
        assert [a["name"] for a in automations] == [AUTOMATION], applied.stdout
        create_pools(server)
        deploy_all(server)
        yield server


def _crash_window_s() -> float:
    automations = yaml.safe_load(AUTOMATIONS.read_text())["automations"]
    (automation,) = (a for a in automations if a["name"] == AUTOMATION)
    return float(automation["trigger"]["within"])


def _wait_for(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    """Poll `probe` until it returns a value, or fail saying what never happened."""
    deadline = time.monotonic() + timeout_s
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(1)
    return found


def _start_nightly(server: PrefectServer, params: dict[str, object]) -> str:
    deployment = server.api("GET", "/deployments/name/pipeline/nightly")
    assert isinstance(deployment, dict)
    flow_run = server.api(
        "POST", f"/deployments/{deployment['id']}/create_flow_run", {"parameters": params}
    )
    assert isinstance(flow_run, dict)
    return str(flow_run["id"])


def _state(server: PrefectServer, flow_run_id: str) -> dict[str, str]:
    flow_run = server.api("GET", f"/flow_runs/{flow_run_id}")
    assert isinstance(flow_run, dict)
    return flow_run["state"]


def _final_state(server: PrefectServer, flow_run_id: str) -> dict[str, str] | None:
    state = _state(server, flow_run_id)
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    return state if state["type"] in final else None


def _running_task(server: PrefectServer, flow_run_id: str, task: str) -> bool | None:
    runs = server.api(
        "POST",
        "/task_runs/filter",
        {
            "flow_runs": {"id": {"any_": [flow_run_id]}},
            "task_runs": {"name": {"like_": task}, "state": {"type": {"any_": ["RUNNING"]}}},
        },
    )
    assert isinstance(runs, list)
    return True if runs else None


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children[todo.pop()]:
            found.add(child)
            todo.append(child)
    return found


def _signal(pids: set[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signum)


def kill_like_a_lost_node(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and everything under it at one instant, as a node that loses power or
    a cgroup-wide kill (`systemctl kill -s KILL`, the OOM killer) does.

    Prefect starts a flow run in a session of its own, so the worker's process group does not
    hold it. Every process is stopped before any is killed: none sees another die and reports
    the run's end, which is what leaves a run RUNNING with nobody to finish it.
    """
    stopped: set[int] = set()
    while batch := ({worker.pid} | _descendants(worker.pid)) - stopped:
        _signal(batch, signal.SIGSTOP)
        stopped |= batch
    _signal(stopped, signal.SIGKILL)
    worker.wait(timeout=30)


def _markers(text: str) -> Counter[tuple[str, str]]:
    return Counter(MARKER.findall(text))


def _block(text: str, key: str) -> str:
    body = text.split(f"<!-- generated:{key} begin -->")[1]
    return body.split(f"<!-- generated:{key} end -->")[0]


def test_killed_worker_crashes_the_run_and_a_rerun_writes_each_adr_block_once(
    crash_server: PrefectServer,
    small_fork: ForkFixture,
    adr_copy: Path,
    tiny_kernel_matrix: Path,
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    params: dict[str, object] = {
        "fork": small_fork.fork,
        "upstream": small_fork.upstream,
        "scope": None,
        "adr_dir": str(adr_copy),
        "results_root": str(results),
        "stages": ["audit", "kernels"],
        "kernel_matrix": str(tiny_kernel_matrix),
        "kernel_targets": ["gfx90a"],
        "pools": {},
    }
    heartbeats = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": HEARTBEAT_S}
    worker = start_worker(crash_server, "cpu", tmp_path / "worker-killed.log", **heartbeats)
    workers = [worker]
    try:
        # Holding the ADR writers' lock, as a concurrent `adrkit update` would, stops the run at
        # the step that matters here: its stages are done and it is about to write the ADRs.
        with lock_for(adr_copy).acquire(timeout=10):
            killed = _start_nightly(crash_server, params)
            _wait_for(
                "the killed run waiting to write the ADRs",
                lambda: _running_task(crash_server, killed, "write_adrs"),
                RUN_TIMEOUT_S,
            )
            kill_like_a_lost_node(worker)
        killed_at = time.monotonic()
        # Nothing reported the end of the run: without the automation it would stay RUNNING.
        assert _state(crash_server, killed)["type"] == "RUNNING"
        crashed = _wait_for(
            "the killed run marked crashed",
            lambda: _final_state(crash_server, killed),
            _crash_window_s() + CRASH_SLACK_S,
        )
        print(f"crashed {time.monotonic() - killed_at:.0f} s after the kill")
        assert crashed["type"] == "CRASHED", crashed
        assert "No heartbeat" in crashed["message"], crashed

        workers.append(
            start_worker(crash_server, "cpu", tmp_path / "worker-rerun.log", **heartbeats)
        )
        rerun = _start_nightly(crash_server, params)
        completed = _wait_for(
            "the rerun finished", lambda: _final_state(crash_server, rerun), RUN_TIMEOUT_S
        )
    finally:
        # The runs' own sessions too: a worker's process group does not hold them.
        for started in workers:
            if started.poll() is None:
                kill_like_a_lost_node(started)
    assert completed["type"] == "COMPLETED", completed

    # Every ADR holds each generated block once, the rerun's, and nothing from the killed run.
    for path in sorted(adr_copy.glob("*.md")):
        text = path.read_text()
        markers = _markers(text)
        assert markers == _markers((REPO_ROOT / "docs" / "adr" / path.name).read_text()), path
        assert set(markers.values()) <= {1}, path
        assert killed not in text, path
    audit_adr = (adr_copy / "0012-vendor-fork-audit.md").read_text()
    for key in ("audit-summary", "audit-findings"):
        assert rerun in _block(audit_adr, key), key
    kernels_adr = (adr_copy / "0009-int8-kv-cache-quantization.md").read_text()
    assert rerun in _block(kernels_adr, "kvquant-resources")
    status_adr = (adr_copy / "0001-record-architecture-decisions.md").read_text()
    assert rerun in _block(status_adr, "pipeline-status")
    # The killed run left no half-written file behind.
    assert not list(adr_copy.rglob(".*.tmp"))
    # The ADRs parse, and re-rendering them from the results changes nothing.
    check = subprocess.run(
        [
            *(sys.executable, "-m", "adrkit", "update", "--check"),
            *("--adr-dir", str(adr_copy), "--results", str(results)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
