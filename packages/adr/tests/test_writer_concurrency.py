"""Concurrent and killed writers: real `python -m adrkit update` processes, each with its own
TMPDIR and working directory, naming the ADR directory by different paths.

Nothing here waits for a time to pass. A writer is paused, or killed by SIGKILL as a lost node
is, at an exact point of its update, found by a Python audit hook that a `sitecustomize` module
installs in the writer (the hook fires before the call it reports): at its N-th rename into the
ADR directory, or its N-th open or removal of a file there. The test goes on when the writer
tells it, by a file, that it got there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from adrkit import update_adrs, write_record
from adrkit._journal import JOURNAL_NAME
from adrkit.schema import Table

from conftest import ACCURACY_ADR, ADR_EN, PNG, make_record, python_env

HOOK = """
import fcntl, os, signal, sys, time

role = os.environ.get("ADRKIT_TEST_HOOK")
adr_dir = os.path.realpath(os.environ.get("ADRKIT_TEST_ADR_DIR", "/nonexistent"))
watched = {adr_dir, os.path.join(adr_dir, "assets")}
signal_file, go_file = os.environ.get("ADRKIT_TEST_SIGNAL"), os.environ.get("ADRKIT_TEST_GO")
event_wanted = os.environ.get("ADRKIT_TEST_EVENT", "os.rename")
left = int(os.environ.get("ADRKIT_TEST_COUNT", "0"))
exclusive_locks = 0


def into_adr_dir(path):
    return isinstance(path, (str, bytes, os.PathLike)) and (
        os.path.dirname(os.path.realpath(os.fsdecode(path))) in watched
    )


def hook(event, args):
    global left, exclusive_locks
    path = args[1] if event == "os.rename" else args[0] if args else None
    if role == "kill" and event == event_wanted and into_adr_dir(path):
        if left == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        left -= 1
    elif role == "pause" and event == "os.rename" and into_adr_dir(args[1]):
        if not os.path.exists(signal_file):
            open(signal_file, "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(go_file) and time.monotonic() < deadline:
                time.sleep(0.01)
    elif role == "tell-when-waiting" and event == "fcntl.flock" and args[1] & fcntl.LOCK_EX:
        exclusive_locks += 1
        if exclusive_locks == 2:  # the first try found the lock held: this writer waits
            open(signal_file, "w").close()


if role:
    sys.addaudithook(hook)
"""

ADR_0013 = ADR_EN.replace("# 0012 Vendor fork audit", "# 0013 Second")
# What the update of the set-up below renames into the ADR directory: the journal, three ADRs,
# the index and one figure.
RENAMES = 6


class Writers:
    """Starts `python -m adrkit update` writers on one ADR directory, each from its own working
    directory, with its own TMPDIR and its own path to the ADR directory."""

    def __init__(self, root: Path, adr_dir: Path, results: Path) -> None:
        self.root, self.adr_dir, self.results = root, adr_dir, results
        self.hook_dir = root / "hook"
        self.hook_dir.mkdir()
        (self.hook_dir / "sitecustomize.py").write_text(HOOK)
        (root / "adr-link").symlink_to(adr_dir)
        self.started = 0

    def start(self, *extra: str, **hook: str) -> subprocess.Popen[str]:
        self.started += 1
        cwd = self.root.joinpath(f"cwd-{self.started}", *["deeper"] * (self.started % 3))
        cwd.mkdir(parents=True)
        tmpdir = self.root / f"tmp-{self.started}"
        tmpdir.mkdir()
        # Relative paths from each writer's own cwd, every other one through a link.
        adr = self.root / ("adr-link" if self.started % 2 else self.adr_dir.name)
        env = python_env(
            TMPDIR=str(tmpdir),
            ADRKIT_TEST_ADR_DIR=str(self.adr_dir),
            **{f"ADRKIT_TEST_{key.upper()}": value for key, value in hook.items()},
        )
        env["PYTHONPATH"] = os.pathsep.join([str(self.hook_dir), env["PYTHONPATH"]])
        args = [
            "--adr-dir",
            os.path.relpath(adr, cwd),
            "--results",
            os.path.relpath(self.results, cwd),
        ]
        return subprocess.Popen(
            [sys.executable, "-m", "adrkit", "update", *args, *extra],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *extra: str, **hook: str) -> subprocess.CompletedProcess[str]:
        process = self.start(*extra, **hook)
        stdout, stderr = process.communicate(timeout=120)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _wait_for(what: str, done: Callable[[], bool], writer: subprocess.Popen[str]) -> None:
    """Wait until ``done``; a writer that exits first has failed (its output says why)."""
    deadline = time.monotonic() + 120
    while not done():
        if writer.poll() is not None:
            raise AssertionError(f"the writer exited before {what}: {writer.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _set_up(root: Path) -> tuple[Path, Path]:
    adr_dir = root / "adr"
    adr_dir.mkdir(parents=True)
    (adr_dir / "0012-fork-audit.md").write_text(ADR_EN)
    (adr_dir / "0013-second.md").write_text(ADR_0013)
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    return adr_dir, root / "results"


def _write_run(results: Path, run: str, ended_at: str, figure: bytes | None) -> None:
    """An audit and an accuracy record (with its figure, unless ``figure`` is None) of one run."""
    write_record(results, make_record(run_id=run, ended_at=ended_at, summary=f"from {run}"))
    stage_dir = results / run / "accuracy"
    stage_dir.mkdir(parents=True)
    artifacts = {}
    if figure is not None:
        (stage_dir / "plot.png").write_bytes(PNG + figure)
        artifacts["accuracy_deltas.png"] = str(stage_dir / "plot.png")
    accuracy = replace(
        make_record("accuracy", run_id=run, ended_at=ended_at),
        tables={"deltas": Table(["task", "delta"], [[run, 0.01]])},
        artifacts=artifacts,
    )
    write_record(results, accuracy)


def _snapshot(adr_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(adr_dir)): p.read_bytes()
        for p in sorted(adr_dir.rglob("*"))
        if p.is_file()
    }


def _expected(root: Path, results: Path) -> dict[str, bytes]:
    """The ADR set that one uninterrupted update of the set-up writes from ``results``."""
    clean, _ = _set_up(root / f"clean-{len(list(root.glob('clean-*')))}")
    update_adrs(clean, results)
    return _snapshot(clean)


def _stray(adr_dir: Path) -> list[str]:
    return sorted(p.name for p in adr_dir.rglob(".*"))


def test_writers_with_their_own_tmpdir_and_cwd_wait_for_each_other(tmp_path: Path) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    paused, go = tmp_path / "first-paused", tmp_path / "go"
    first = writers.start(hook="pause", signal=str(paused), go=str(go))
    _wait_for("it reached its first rename", paused.exists, first)

    # The first writer holds the lock, its plan made from run-1 only. A second writer with a
    # newer record must wait for it, then write run-2 everywhere.
    _write_run(results, "run-2", "2026-11-29T03:00:00Z", b"second")
    waiting = tmp_path / "second-waiting"
    second = writers.start(hook="tell-when-waiting", signal=str(waiting))
    # Where the lock does not hold, the second writer finishes instead, the first still paused.
    _wait_for("it waited or finished", lambda: waiting.exists() or second.poll() is not None, first)
    go.touch()
    outs = [process.communicate(timeout=120) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs

    assert _snapshot(adr_dir) == _expected(tmp_path, results)
    assert "run `run-2`" in (adr_dir / "0013-second.md").read_text()
    assert _stray(adr_dir) == []
    assert writers.run("--check").returncode == 0


def test_eight_writers_with_their_own_tmpdir_and_cwd_lose_no_update(tmp_path: Path) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    stages = [f"stage-{i}" for i in range(8)]
    processes = []
    for stage in stages:  # each record is written just before its writer starts
        write_record(results, make_record(stage, run_id=f"run-{stage}"))
        processes.append(writers.start())
    outs = [process.communicate(timeout=120) for process in processes]
    assert [p.returncode for p in processes] == [0] * 8, outs
    status = (adr_dir / "0012-fork-audit.md").read_text().split("generated:pipeline-status")[1]
    assert all(f"| {stage} | cpu | passed |" in status for stage in stages)
    assert _stray(adr_dir) == []
    assert writers.run("--check").returncode == 0


KILL_POINTS = [
    *(("os.rename", n) for n in range(RENAMES)),
    # While it reads the ADRs and writes its temp files: nothing renamed yet.
    *(("open", n) for n in (0, 4, 9)),
]


@pytest.mark.parametrize("next_update", ["newer-records", "refused-input"])
@pytest.mark.parametrize(("event", "count"), KILL_POINTS)
def test_a_writer_killed_at_any_point_leaves_no_mixed_set_after_the_next_update(
    tmp_path: Path, event: str, count: int, next_update: str
) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    old = _snapshot(adr_dir)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    new = _expected(tmp_path, results)
    assert set(new) == {*old, "README.md", "assets/accuracy-cpu-accuracy_deltas.png"}

    killed = writers.run(hook="kill", event=event, count=str(count))

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    now = _snapshot(adr_dir)
    journal = adr_dir / JOURNAL_NAME
    if not journal.exists():  # killed before it committed: nothing changed but temp files
        assert {
            name: data for name, data in now.items() if not Path(name).name.startswith(".")
        } == old
    if event == "os.rename":
        # The journal commits at the first rename; each later one replaces one file.
        assert journal.exists() is (count > 0)
        replaced = [
            name for name in new if now.get(name) == new[name] and old.get(name) != new[name]
        ]
        assert len(replaced) == max(count - 1, 0)

    if next_update == "newer-records":
        _write_run(results, "run-2", "2026-11-29T03:00:00Z", b"second")
        expected = _expected(tmp_path, results)
        after = writers.run()
        assert after.returncode == 0, after.stderr
    else:
        # An update that refuses its input still completes the killed one first: the set it
        # leaves is the killed writer's whole set, or the old one, never a mix.
        expected = new if count > 0 and event == "os.rename" else old
        corrupt = results / "run-9"
        corrupt.mkdir()
        (corrupt / "audit.json").write_text("{not json")
        after = writers.run()
        assert after.returncode == 2, after.stderr
    assert _snapshot(adr_dir) == expected
    assert _stray(adr_dir) == []


def test_a_writer_killed_while_it_completes_another_killed_writer_is_completed_in_turn(
    tmp_path: Path,
) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    assert writers.run(hook="kill", event="os.rename", count="2").returncode == -signal.SIGKILL
    renames = json.loads((adr_dir / JOURNAL_NAME).read_text())["renames"]
    assert len(renames) == RENAMES - 1
    # The second writer's first renames are those the first did not get to.
    assert writers.run(hook="kill", event="os.rename", count="1").returncode == -signal.SIGKILL
    assert (adr_dir / JOURNAL_NAME).exists()
    _write_run(results, "run-2", "2026-11-29T03:00:00Z", b"second")
    assert writers.run().returncode == 0
    assert _snapshot(adr_dir) == _expected(tmp_path, results)
    assert _stray(adr_dir) == []


FIGURE = "assets/accuracy-cpu-accuracy_deltas.png"


# Killed at its first rename after the journal (the ADRs half written, the figure still there),
# or at the removal itself, once every file is renamed.
@pytest.mark.parametrize(("event", "count"), [("os.rename", 1), ("os.remove", 0)])
def test_a_writer_killed_before_it_removed_a_stale_figure_is_completed_by_the_next(
    tmp_path: Path, event: str, count: int
) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    assert writers.run().returncode == 0
    assert (adr_dir / FIGURE).exists()
    _write_run(results, "run-2", "2026-11-29T03:00:00Z", None)  # its accuracy has no figure

    killed = writers.run(hook="kill", event=event, count=str(count))

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = json.loads((adr_dir / JOURNAL_NAME).read_text())
    assert journal["removals"] == [FIGURE]
    assert (adr_dir / FIGURE).exists()
    after = writers.run()
    assert after.returncode == 0, after.stderr
    removed = [line for line in after.stdout.splitlines() if line.startswith("removed: ")]
    assert len(removed) == 1 and removed[0].endswith(FIGURE), after.stdout
    assert not (adr_dir / FIGURE).exists()
    assert _snapshot(adr_dir) == _expected(tmp_path, results)
    assert _stray(adr_dir) == []
    assert writers.run("--check").returncode == 0


def test_a_journal_without_removals_as_written_before_them_is_completed(tmp_path: Path) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    assert writers.run(hook="kill", event="os.rename", count="2").returncode == -signal.SIGKILL
    journal = adr_dir / JOURNAL_NAME
    journal.write_text(json.dumps({"renames": json.loads(journal.read_text())["renames"]}))
    assert writers.run().returncode == 0
    assert _snapshot(adr_dir) == _expected(tmp_path, results)
    assert _stray(adr_dir) == []


def test_a_journal_that_removes_anything_but_a_figure_is_refused(tmp_path: Path) -> None:
    adr_dir, results = _set_up(tmp_path)
    writers = Writers(tmp_path, adr_dir, results)
    _write_run(results, "run-1", "2026-11-29T02:00:00Z", b"first")
    assert writers.run().returncode == 0
    before = _snapshot(adr_dir)
    journal = adr_dir / JOURNAL_NAME
    journal.write_text(json.dumps({"renames": [], "removals": ["0012-fork-audit.md"]}))
    refused = writers.run()
    assert refused.returncode == 2
    assert "is not a journal of adrkit's" in refused.stderr and "no figure" in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert _snapshot(adr_dir) == before | {JOURNAL_NAME: journal.read_bytes()}
