"""The README's two commands in the README's order: `nox -s nightly` leaves a `.results/` in the
checkout and newer records in `docs/adr`, and `nox -s test` must pass all the same. So no test may
read the working tree's `.results/` or depend on `docs/adr`'s records unless it says so.

This test copies the checkout, plants there what a nightly leaves (a results root of every stage,
newer than any test's records, with a figure; the ADRs updated and the store filled from it), and
runs, from the copy's root, the suites that read the working directory or `docs/adr`: adrkit's
(less the writer-concurrency and fuzz modules, which pass every path explicitly and take most of
its time) and the flows tests that render the ADRs in process. CI runs the pipeline's audit stage
in its clone before the test session, so the whole suite meets a `.results/` there as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adrkit import utc_now, write_record
from adrkit.schema import Gate, Provenance, Record, Table

from conftest import REPO_ROOT

STAGES = ("audit", "kernels", "correctness", "accuracy", "throughput")
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
ADR_TESTS_LEFT_OUT = ("test_writer_concurrency.py", "test_record_fuzz.py", "test_adr_text_fuzz.py")
FLOWS_TESTS = ("test_audit.py", "test_block_sources.py", "test_gates.py")


def _copy_checkout(target: Path) -> None:
    """The checkout's files as git sees them (tracked, and new ones not ignored), at TARGET."""
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(REPO_ROOT),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        capture_output=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _nightly_records(results: Path) -> None:
    """A run of every stage, as the nightly writes it, ended now: newer than any test's."""
    now = utc_now()
    for stage in STAGES:
        run_dir = results / "nightly-1" / stage
        run_dir.mkdir(parents=True)
        (run_dir / "accuracy_deltas.png").write_bytes(PNG + b"nightly")
        record = Record(
            stage=stage,
            status="passed",
            summary="the nightly's",
            metrics={"files_total": 99, "rows": 9, "rows_passed": 9, "surprise": False},
            tables={"findings": Table(["stream", "path"], [["A", "vllm/nightly.py"]])},
            gates=[Gate.judge("vendor_risk_changes", 0.0, "<=", 0.0)],
            artifacts={"accuracy_deltas.png": str(run_dir / "accuracy_deltas.png")},
            provenance=Provenance(run_id="nightly-1", started_at=now, ended_at=now),
        )
        write_record(results, record)


def _pytest(copy: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    packages = ("record", "adr", "audit", "kvquant", "bench")
    sources = [copy / "packages" / name / "src" for name in packages]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(map(str, [copy, *sources])),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout")
def test_the_suites_pass_in_a_checkout_a_nightly_left_its_results_in(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    _copy_checkout(copy)
    _nightly_records(copy / ".results")
    # What the nightly's last step does: the ADRs and the store from its run.
    stored = _update_from_the_root(copy)
    assert stored.returncode == 0, stored.stderr
    assert (
        (copy / "docs" / "adr" / "evidence" / "cpu" / "audit.json").read_text().count("nightly-1")
    )

    adr_tests = sorted(
        str(path.relative_to(copy))
        for path in (copy / "packages" / "adr" / "tests").glob("test_*.py")
        if path.name not in ADR_TESTS_LEFT_OUT
    )
    flows_tests = [f"flows/tests/{name}" for name in FLOWS_TESTS]
    for targets in (adr_tests, flows_tests):
        run = _pytest(copy, *targets)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def _update_from_the_root(copy: Path) -> subprocess.CompletedProcess[str]:
    """`adrkit update --store .results/nightly-1` from the copy's root, which reads `.results`
    and writes `docs/adr` there by default."""
    sources = [copy / "packages" / name / "src" for name in ("record", "adr")]
    return subprocess.run(
        [sys.executable, "-m", "adrkit", "update", "--store", ".results/nightly-1"],
        cwd=copy,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(map(str, sources))},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
