"""The pipeline deployed from flows/prefect.yaml and run by a worker on a real Prefect server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adrkit import load_latest

from conftest import (
    ForkFixture,
    PrefectServer,
    create_pools,
    deploy_all,
    generated_blocks,
    other_language,
)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WORKER_TIMEOUT_S = 600  # an upper bound: CI runs the vllm session beside these tests


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
    # INFO, not the fixture's WARNING: the worker's output then says how far the run got.
    worker = server.cli(
        "worker", "start", "--pool", "cpu", "--run-once",
        timeout=WORKER_TIMEOUT_S, PREFECT_LOGGING_LEVEL="INFO",
    )  # fmt: skip
    flow_run = server.api("GET", f"/flow_runs/{flow_run_id.group(0)}")
    assert isinstance(flow_run, dict)
    assert worker.returncode == 0, (
        f"flow run state: {flow_run['state']}\n{worker.stdout[-3000:]}{worker.stderr[-3000:]}"
    )
    return flow_run


# The toy tree's env var table as a plugin hook: the fork's patch changes it.
SMALL_FORK_HOOKS = """\
releases = ["1.0.0"]

[[hook]]
symbol = "vllm.envs:environment_variables"
kind = "value"
why = "The env vars the plugin reads."
"""


@pytest.fixture
def params(
    small_fork: ForkFixture,
    adr_copy: Path,
    tmp_path: Path,
    tiny_kernel_matrix: Path,
    tiny_accuracy_config: Path,
) -> dict[str, object]:
    """Deployment parameters: the fork fixture with hooks declared for its toy tree, a temporary
    copy of the ADRs and results root."""
    hooks = tmp_path / "hooks.toml"
    hooks.write_text(SMALL_FORK_HOOKS)
    return {
        "fork": small_fork.fork,
        "upstream": small_fork.upstream,
        "scope": None,
        "hooks": str(hooks),
        "hooks_version": "1.0.0",
        "adr_dir": str(adr_copy),
        "results_root": str(tmp_path / "results"),
        "kernel_matrix": str(tiny_kernel_matrix),
        "kernel_targets": ["gfx90a"],
        "accuracy_config": str(tiny_accuracy_config),
        # Every stage in the worker's own process: these tests start no GPU-pool worker.
        "pools": {},
    }


def _adr(params: dict[str, object], name: str) -> str:
    return (Path(str(params["adr_dir"])) / name).read_text()


def _state(flow_run: dict[str, object]) -> dict[str, object]:
    state = flow_run["state"]
    assert isinstance(state, dict)
    return state


def test_nightly_deployment_runs_every_stage_and_writes_adrs(
    deployed: PrefectServer, params: dict[str, object]
) -> None:
    flow_run = _run_deployment(deployed, "pipeline/nightly", params)
    assert _state(flow_run)["type"] == "COMPLETED", _state(flow_run)

    records = load_latest(Path(str(params["results_root"])))
    assert set(records) == {"audit", "kernels", "correctness", "accuracy", "throughput"}
    audit = records["audit"]
    assert audit.provenance.flow_run_id == flow_run["id"]
    assert audit.metrics["files_modified"] == 2
    # The fork's patch touches env vars and an attention backend: a gate failure, recorded.
    assert audit.status == "failed"
    assert not audit.gates_passed
    # And a changed plugin hook, named in the record's summary.
    assert [g.name for g in audit.gates if not g.passed] == [
        "vendor_risk_changes",
        "plugin_hooks_changed",
    ]
    assert audit.summary.endswith("(vllm.envs:environment_variables changed)")
    # One cell per Triton build: the newest installed, and the target's where it is installed.
    kernels = records["kernels"].metrics
    assert kernels["cells"] == 1 + (kernels["triton_target_not_built"] is None)
    # The matrix's own gates first, then flows/gates.toml's.
    assert [g.name for g in records["kernels"].gates][-1] == "cells_failed"
    assert records["correctness"].status == "passed"
    assert [g.name for g in records["correctness"].gates] == [
        "worst_error_to_tolerance",
        "edge_cases_failed",
    ]
    accuracy = records["accuracy"]
    assert accuracy.metrics["rows"] == 1  # kvb_arc_easy acc, single-pass
    assert [g.name for g in accuracy.gates] == [
        "kvb_arc_easy acc (single-pass) |delta|",
        "divergence int8 (reference) mean KLD",
        "divergence int8 (reference) same top-1",
        "divergence int8 (reference) PPL ratio",
        "divergence_controls_failed",
    ]
    assert accuracy.metrics["divergence_controls_failed"] == 0
    # This machine has no vLLM: the throughput stage says so instead of failing.
    assert records["throughput"].status == "skipped"
    assert "vLLM is not installed" in str(records["throughput"].reason)

    audit_adr = _adr(params, "0012-vendor-fork-audit.md")
    for key in ("audit-summary", "audit-findings"):
        body = audit_adr.split(f"<!-- generated:{key} begin -->")[1].split("<!-- generated:")[0]
        assert str(flow_run["id"]) in body, key
    assert "vllm/envs.py" in audit_adr
    kernels_adr = _adr(params, "0009-int8-kv-cache-quantization.md")
    assert "| gfx90a | reduce_splits |" in kernels_adr
    # A fresh results root holds no earlier build: the diff block must not claim "no change".
    diff_block = kernels_adr.split("<!-- generated:kvquant-resource-diff begin -->\n")[1]
    assert diff_block.startswith("此结果目录下没有之前的构建：没有可比较的对象。\n")
    accuracy_block = kernels_adr.split("<!-- generated:kvbench-accuracy begin -->")[1]
    accuracy_block = accuracy_block.split("<!-- generated:kvbench-accuracy end -->")[0]
    assert "| kvb_arc_easy | acc | single-pass | 2 |" in accuracy_block
    assert str(flow_run["id"]) in accuracy_block
    assert "(assets/accuracy-cpu-accuracy_deltas.png)" in accuracy_block
    assert (Path(str(params["adr_dir"])) / "assets" / "accuracy-cpu-accuracy_deltas.png").is_file()
    divergence_block = kernels_adr.split("<!-- generated:kvbench-divergence begin -->")[1]
    divergence_block = divergence_block.split("<!-- generated:kvbench-divergence end -->")[0]
    assert "| 被测缓存 | int8 | 读取缓存 | torch 参考实现 | 126 |" in divergence_block
    assert "(assets/accuracy-cpu-divergence_kld.png)" in divergence_block
    # The run's records went into the ADRs' evidence store, one per stage on this CPU, but the
    # skipped throughput stage's, which measured nothing.
    store = Path(str(params["adr_dir"])) / "evidence" / "cpu"
    run_id = audit.provenance.run_id
    stored = {p.stem for p in store.glob("*.json") if run_id in p.read_text()}
    assert stored == {"audit", "kernels", "correctness", "accuracy"}
    status_adr = _adr(params, "0001-record-architecture-decisions.md")
    assert f"流程运行 `{flow_run['id']}`" in status_adr
    # Every generated block of every ADR speaks only its ADR's language.
    for path in sorted(Path(str(params["adr_dir"])).glob("[0-9][0-9][0-9][0-9]-*.md")):
        text = path.read_text()
        lang = "zh" if "\nlang: zh\n" in text.split("\n---\n", 1)[0] + "\n" else "en"
        for key, body in generated_blocks(text).items():
            assert not other_language(body, lang), (path.name, key, other_language(body, lang))

    keys = [
        "audit-report",
        "audit-findings",
        "kernels-report",
        "kernels-resources",
        "correctness-report",
        "correctness-errors",
        "accuracy-report",
        "accuracy-deltas",
        "throughput-report",
        "throughput-e2e",
        "adr-update",
    ]
    artifacts = deployed.api("POST", "/artifacts/filter", {"artifacts": {"key": {"any_": keys}}})
    assert isinstance(artifacts, list)
    assert {a["key"] for a in artifacts} == set(keys)


def test_milestone_deployment_fails_on_a_failed_gate_after_writing_adrs(
    deployed: PrefectServer, params: dict[str, object]
) -> None:
    params |= {"milestone": "m1", "stages": ["audit"]}
    flow_run = _run_deployment(deployed, "pipeline/milestone", params)
    assert _state(flow_run)["type"] == "FAILED", _state(flow_run)
    assert "gate vendor_risk_changes" in str(_state(flow_run)["message"])
    assert str(flow_run["id"]) in _adr(params, "0012-vendor-fork-audit.md")


def test_nightly_records_a_crashed_stage_and_runs_the_others(
    deployed: PrefectServer, params: dict[str, object], tmp_path: Path
) -> None:
    # kernels (one small cell) is the stage that must still run: the quickest one that can.
    params |= {"fork": str(tmp_path / "no-such-fork"), "stages": ["audit", "kernels"]}
    flow_run = _run_deployment(deployed, "pipeline/nightly", params)
    assert _state(flow_run)["type"] == "COMPLETED", _state(flow_run)

    records = load_latest(Path(str(params["results_root"])))
    assert records["audit"].status == "failed"
    assert "no-such-fork" in str(records["audit"].reason)
    assert "\n" not in str(records["audit"].reason)
    assert records["kernels"].status == "passed"
    status_adr = _adr(params, "0001-record-architecture-decisions.md")
    assert re.search(r"\| audit \| [^|]+ \| 失败 \|", status_adr)
    assert re.search(r"\| kernels \| [^|]+ \| 通过 \|", status_adr)


def test_a_gpu_stage_with_no_worker_is_reported_not_run(
    deployed: PrefectServer, params: dict[str, object]
) -> None:
    params |= {
        "stages": ["correctness"],
        "pools": {"correctness": "gfx90a"},
        "pickup_timeout_s": 5,
    }
    flow_run = _run_deployment(deployed, "pipeline/nightly", params)
    assert _state(flow_run)["type"] == "COMPLETED", _state(flow_run)
    record = load_latest(Path(str(params["results_root"])))["correctness"]
    assert record.status == "skipped"
    assert record.reason == (
        "not run: no worker on pool 'gfx90a' took the correctness run within 5 s"
    )
    status_adr = _adr(params, "0001-record-architecture-decisions.md")
    assert re.search(
        r"\| correctness \| [^|]+ \| 跳过 \| `not run: no worker on pool 'gfx90a'", status_adr
    )
