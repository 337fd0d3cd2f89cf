from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import git
import pytest

from adrkit import (
    AdrError,
    CommitError,
    RenderError,
    ResultsError,
    Table,
    update_adrs,
    write_record,
)
from adrkit.__main__ import main

from conftest import ADR_EN, make_record

HUMAN = re.compile(r"<!-- generated:(\S+) begin -->.*?<!-- generated:\1 end -->", re.DOTALL)


def human_text(text: str) -> list[str]:
    """Everything outside block bodies, markers included."""
    return HUMAN.sub(lambda m: m.group(0).split("\n", 1)[0] + m.group(1), text).splitlines(True)


def test_blocks_render_with_run_id_and_commit(adr_dir: Path, results: Path) -> None:
    result = update_adrs(adr_dir, results)
    text = (adr_dir / "0012-fork-audit.md").read_text()
    assert adr_dir / "0012-fork-audit.md" in result.changed
    assert "old summary" not in text
    assert "run `run-1` (flow run `flow-run-xyz`), commit `0123456789ab`" in text
    assert "| Files differing | 3 |" in text
    index = (adr_dir / "README.md").read_text()
    assert (
        "| [0012](0012-fork-audit.md) | 0012 Vendor fork audit | accepted | 2026-11-29 |" in index
    )


def test_chinese_adr_gets_chinese_labels(adr_dir: Path, results: Path) -> None:
    path = adr_dir / "0012-fork-audit.md"
    path.write_text(ADR_EN.replace("lang: en", "lang: zh"))
    update_adrs(adr_dir, results)
    text = path.read_text()
    assert "| 差异文件数 | 3 |" in text
    assert "来源：阶段 `audit`，运行 `run-1`" in text


def test_human_text_is_byte_identical_after_100_rewrites(adr_dir: Path, tmp_path: Path) -> None:
    path = adr_dir / "0012-fork-audit.md"
    before = human_text(path.read_bytes().decode())
    for i in range(100):
        root = tmp_path / "r"
        write_record(
            root,
            make_record(
                run_id=f"run-{i}",
                ended_at=f"2026-11-29T02:00:{i:02d}",
                files_total=i,
                summary="x" * (i % 7),
            ),
        )
        update_adrs(adr_dir, root)
        assert human_text(path.read_bytes().decode()) == before
    assert "run `run-99`" in path.read_text()
    assert path.read_text().endswith("Last line without newline")


_WRITER = """
import sys
from pathlib import Path
from adrkit import update_adrs, write_record
sys.path.insert(0, sys.argv[3])
from conftest import make_record
root, adr_dir, _, stage = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
write_record(root, make_record(stage, run_id="run-" + stage, ended_at="2026-11-29T03:00:00Z"))
update_adrs(adr_dir, root)
"""


def test_eight_concurrent_writers_lose_no_update(adr_dir: Path, results: Path) -> None:
    stages = [f"stage-{i}" for i in range(8)]
    tests_dir = str(Path(__file__).parent)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(results), str(adr_dir), tests_dir, s])
        for s in stages
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    text = (adr_dir / "0012-fork-audit.md").read_text()
    status = text.split("generated:pipeline-status begin")[1]
    assert all(f"| {s} | passed |" in status for s in stages)
    assert update_adrs(adr_dir, results, check=True).changed == ()


# Dies by SIGKILL, as a lost node does, right before its (N+1)-th rename into the ADR directory:
# the temp file is written and synced and the target not yet replaced, the last instant at which
# the old file must survive. Python's audit hook fires before the rename happens.
_WRITER_KILLED_BEFORE_RENAME = """
import os, signal, sys
from pathlib import Path
from adrkit import update_adrs
adr_dir, results, renames_left = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def die_before_rename(event, args):
    global renames_left
    if event == "os.rename" and Path(args[1]).parent == adr_dir:
        if renames_left == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        renames_left -= 1
sys.addaudithook(die_before_rename)
update_adrs(adr_dir, results)
"""


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("renames_done", [0, 1, 2])
def test_writer_killed_before_a_rename_leaves_each_file_old_or_new_and_the_next_update_cleans_up(
    adr_dir: Path, results: Path, tmp_path: Path, renames_done: int
) -> None:
    (adr_dir / "0013-second.md").write_text(ADR_EN.replace("# 0012 Vendor", "# 0013 Second"))
    old = _snapshot(adr_dir)
    clean_run = tmp_path / "clean-run"
    shutil.copytree(adr_dir, clean_run)
    update_adrs(clean_run, results)
    new = _snapshot(clean_run)
    assert len(new) == 3  # two ADRs and the index, all changed, so every kill lands mid-update
    assert all(new[name] != old.get(name) for name in new)

    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            _WRITER_KILLED_BEFORE_RENAME,
            str(adr_dir),
            str(results),
            str(renames_done),
        ],
        check=False,
    )

    assert killed.returncode == -signal.SIGKILL
    temps = [p.name for p in adr_dir.iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == 1, temps  # the file whose rename never happened
    after = {name: text for name, text in _snapshot(adr_dir).items() if name not in temps}
    replaced = [name for name, text in after.items() if text == new[name]]
    kept = [name for name, text in after.items() if text == old.get(name)]
    assert len(replaced) == renames_done
    assert sorted(replaced + kept) == sorted(after)

    update_adrs(adr_dir, results)
    assert _snapshot(adr_dir) == new  # every file new, no temp file left


def test_check_detects_staleness_and_writes_nothing(adr_dir: Path, results: Path) -> None:
    path = adr_dir / "0012-fork-audit.md"
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results), "--check"]) == 1
    assert "old summary" in path.read_text()
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results)]) == 0
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results), "--check"]) == 0
    write_record(results, make_record(run_id="run-2", ended_at="2026-11-30T00:00:00Z"))
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results), "--check"]) == 1


def test_unknown_block_key_changes_no_file(adr_dir: Path, results: Path) -> None:
    (adr_dir / "0013-other.md").write_text(
        "# x\n<!-- generated:no-such-block begin -->\n<!-- generated:no-such-block end -->\n"
    )
    before = _snapshot(adr_dir)
    with pytest.raises(RenderError, match="no renderer knows block key 'no-such-block'"):
        update_adrs(adr_dir, results)
    assert _snapshot(adr_dir) == before


@pytest.mark.parametrize(
    "problem", ["missing", "not-a-directory", "corrupt", "wrong-type", "markers", "no-adrs"]
)
def test_cli_bad_input_is_one_line_and_changes_nothing(
    adr_dir: Path, results: Path, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = results / "run-1" / "audit.json"
    if problem == "missing":
        results = results / "absent"
    elif problem == "not-a-directory":
        results = record
    elif problem == "corrupt":
        record.write_text("{not json")
    elif problem == "wrong-type":
        record.write_text(json.dumps(json.loads(record.read_text()) | {"metrics": [1]}))
    elif problem == "markers":
        (adr_dir / "0001-a.md").write_text("# a\n<!-- generated:audit-summary begin -->\n")
    else:
        (adr_dir / "0012-fork-audit.md").unlink()
        (adr_dir / "README.md").write_text("# A hand-written README, not an ADR index\n")
    before = _snapshot(adr_dir)
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adrkit: error: ") and err.count("\n") == 1
    assert _snapshot(adr_dir) == before


@pytest.mark.parametrize("readme", [None, "# My project\n\nWritten by hand.\n"])
def test_a_directory_without_adrs_gets_no_index_and_keeps_its_readme(
    tmp_path: Path, results: Path, readme: str | None
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("# Notes, not an ADR: no NNNN- prefix\n")
    if readme is not None:
        (project / "README.md").write_text(readme)
    before = _snapshot(project)
    for check in (False, True):
        with pytest.raises(AdrError) as info:
            update_adrs(project, results, check=check)
        assert str(info.value) == f"no ADRs (NNNN-*.md) in {project}"
    assert _snapshot(project) == before


# Holds the ADR writers' lock, as a concurrent `adrkit update` would, until its stdin closes.
_LOCK_HOLDER = """
import sys
from pathlib import Path
from adrkit._writer import lock_for
with lock_for(Path(sys.argv[1])).acquire(timeout=10):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_lock_held_too_long_is_a_one_line_error_and_changes_nothing(
    adr_dir: Path, results: Path
) -> None:
    before = _snapshot(adr_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(adr_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(AdrError) as info:
            update_adrs(adr_dir, results, lock_timeout_s=0.2)
    finally:
        holder.communicate(timeout=10)
    assert str(info.value) == (
        f"another adrkit update is holding the lock on {adr_dir} (waited 0.2 s)"
    )
    assert _snapshot(adr_dir) == before
    # Once the holder is gone, the same update goes through.
    assert adr_dir / "0012-fork-audit.md" in update_adrs(adr_dir, results).changed


def test_commit_names_the_run_and_refuses_dirty_or_foreign_trees(
    tmp_path: Path, results: Path
) -> None:
    repo = git.Repo.init(tmp_path / "repo", initial_branch="adr")
    with repo.config_writer() as config:
        config.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    adr_dir = Path(repo.working_dir) / "docs" / "adr"
    adr_dir.mkdir(parents=True)
    (adr_dir / "0012-fork-audit.md").write_text(ADR_EN)
    repo.index.add([str(adr_dir / "0012-fork-audit.md")])
    repo.index.commit("initial")

    with pytest.raises(CommitError, match="the checkout is on adr"):
        update_adrs(adr_dir, results, commit_branch="main")
    (adr_dir / "0012-fork-audit.md").write_text(ADR_EN + "\nhand edit\n")
    with pytest.raises(CommitError, match="uncommitted changes"):
        update_adrs(adr_dir, results, commit_branch="adr")
    assert (adr_dir / "0012-fork-audit.md").read_text().endswith("hand edit\n")
    repo.git.checkout("--", ".")

    result = update_adrs(adr_dir, results, commit_branch="adr")
    assert repo.head.commit.hexsha == result.commit
    assert repo.head.commit.message == "docs(adr): update generated blocks from run run-1"
    assert not repo.is_dirty(untracked_files=True)

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "0012-fork-audit.md").write_text(ADR_EN)
    with pytest.raises(CommitError, match="not inside a git checkout"):
        update_adrs(plain, results, commit_branch="main")
    assert (plain / "0012-fork-audit.md").read_text() == ADR_EN


def test_missing_adr_directory(tmp_path: Path, results: Path) -> None:
    with pytest.raises(AdrError, match="does not exist"):
        update_adrs(tmp_path / "none", results)
    (tmp_path / "file").write_text("")
    with pytest.raises(AdrError, match="exists but is not a directory"):
        update_adrs(tmp_path / "file", results)
    with pytest.raises(ResultsError):
        update_adrs(tmp_path, tmp_path / "none")


def test_figures_are_copied_beside_the_adrs_and_embedded(adr_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfirst")
    record = make_record("accuracy")
    table = Table(["task", "delta"], [["kvb_piqa", 0.01]])
    record = replace(
        record,
        tables={"deltas": table},
        artifacts={"accuracy_deltas.png": str(png), "accuracy.json": str(tmp_path / "a.json")},
    )
    results = tmp_path / "results"
    write_record(results, record)
    (adr_dir / "0009-int8.md").write_text(
        "---\nlang: en\n---\n# 0009 INT8\n"
        "<!-- generated:kvbench-accuracy begin -->\n<!-- generated:kvbench-accuracy end -->\n"
    )
    update_adrs(adr_dir, results)
    text = (adr_dir / "0009-int8.md").read_text()
    assert "| kvb_piqa | 0.01 |" in text
    assert "![Figure: accuracy_deltas.png](assets/accuracy-accuracy_deltas.png)" in text
    copied = adr_dir / "assets" / "accuracy-accuracy_deltas.png"
    assert copied.read_bytes() == png.read_bytes()
    assert not (adr_dir / "assets" / "accuracy-accuracy.json").exists()  # only figures
    # A new figure makes the ADRs stale, though no text changed; the update copies it.
    png.write_bytes(b"\x89PNG\r\n\x1a\nsecond")
    assert update_adrs(adr_dir, results, check=True).changed == (copied,)
    update_adrs(adr_dir, results)
    assert copied.read_bytes().endswith(b"second")
    # Results moved away: the last copy stays, and nothing is stale.
    png.unlink()
    assert update_adrs(adr_dir, results, check=True).changed == ()
    assert copied.exists()


@pytest.mark.parametrize(
    ("lang", "baseline_found", "sentence"),
    [
        ("en", False, "No previous build under this results root: nothing to compare against."),
        ("zh", False, "此结果目录下没有之前的构建：没有可比较的对象。"),
        ("en", True, "No resource use changed since the previous build."),
        ("zh", True, "与上一次构建相比，资源占用没有变化。"),
        # A record from before `baseline_found` existed renders as it always did.
        ("en", None, "No resource use changed since the previous build."),
    ],
)
def test_empty_resource_diff_says_whether_there_was_a_previous_build(
    adr_dir: Path, tmp_path: Path, lang: str, baseline_found: bool | None, sentence: str
) -> None:
    columns = ["target", "kernel", "specialization", "field", "old", "new"]
    diff = Table(columns, [], baseline_found=baseline_found)
    results = tmp_path / "results"
    write_record(results, replace(make_record("kernels"), tables={"resource-diff": diff}))
    path = adr_dir / "0009-int8.md"
    path.write_text(
        f"---\nlang: {lang}\n---\n# 0009 INT8\n"
        "<!-- generated:kvquant-resource-diff begin -->\n"
        "<!-- generated:kvquant-resource-diff end -->\n"
    )
    update_adrs(adr_dir, results)
    block = path.read_text().split("<!-- generated:kvquant-resource-diff begin -->\n")[1]
    assert block.startswith(sentence + "\n")
    assert "`run-1`" in block.split("generated:kvquant-resource-diff end")[0]


def test_table_block_of_a_crashed_stage_shows_why_not_an_empty_table(
    adr_dir: Path, tmp_path: Path
) -> None:
    reason = "kernels crashed: RuntimeError: out of disk"
    crashed = replace(
        make_record("kernels", status="failed", reason=reason, summary="crashed"), tables={}
    )
    results = tmp_path / "results"
    write_record(results, crashed)
    path = adr_dir / "0009-int8.md"
    path.write_text(
        "---\nlang: en\n---\n# 0009 INT8\n"
        "<!-- generated:kvquant-resource-diff begin -->\n"
        "<!-- generated:kvquant-resource-diff end -->\n"
    )
    update_adrs(adr_dir, results)
    block = path.read_text().split("<!-- generated:kvquant-resource-diff begin -->\n")[1]
    assert block.startswith(reason + "\n")
    assert "No resource use changed" not in block
