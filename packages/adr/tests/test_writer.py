from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import git
import pytest

from adrkit import AdrError, CommitError, RenderError, ResultsError, update_adrs, write_record
from adrkit.__main__ import main
from adrkit.schema import Table

from conftest import (
    ACCURACY_ADR,
    ADR_EN,
    PNG,
    assert_one_line_error,
    human_text,
    make_record,
    run_update,
    tree_hashes,
)


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
                ended_at=f"2026-11-29T02:{i // 60:02d}:{i % 60:02d}Z",
                files_total=i,
                summary="x" * (i % 7),
            ),
        )
        update_adrs(adr_dir, root)
        assert human_text(path.read_bytes().decode()) == before
    assert "run `run-99`" in path.read_text()
    assert path.read_text().endswith("Last line without newline")


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
    before = tree_hashes(adr_dir)
    with pytest.raises(RenderError, match="no renderer knows block key 'no-such-block'"):
        update_adrs(adr_dir, results)
    assert tree_hashes(adr_dir) == before


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
    before = tree_hashes(adr_dir)
    assert main(["update", "--adr-dir", str(adr_dir), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adrkit: error: ") and err.count("\n") == 1
    assert tree_hashes(adr_dir) == before


@pytest.mark.parametrize("readme", [None, "# My project\n\nWritten by hand.\n"])
def test_a_directory_without_adrs_gets_no_index_and_keeps_its_readme(
    tmp_path: Path, results: Path, readme: str | None
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("# Notes, not an ADR: no NNNN- prefix\n")
    if readme is not None:
        (project / "README.md").write_text(readme)
    before = tree_hashes(project)
    for check in (False, True):
        with pytest.raises(AdrError) as info:
            update_adrs(project, results, check=check)
        assert str(info.value) == f"no ADRs (NNNN-*.md) in {project}"
    assert tree_hashes(project) == before


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
    before = tree_hashes(adr_dir)
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
    assert tree_hashes(adr_dir) == before
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


def test_a_commit_removes_the_figure_the_newer_record_dropped(tmp_path: Path) -> None:
    repo = git.Repo.init(tmp_path / "repo", initial_branch="adr")
    with repo.config_writer() as config:
        config.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    adr_dir = Path(repo.working_dir) / "docs" / "adr"
    adr_dir.mkdir(parents=True)
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    repo.index.add([str(adr_dir / "0009-int8.md")])
    repo.index.commit("initial")
    results = tmp_path / "results"
    for run, ended_at, figures in (
        ("run-1", "2026-11-29T02:00:00Z", ["accuracy_deltas.png"]),
        ("run-2", "2026-11-29T03:00:00Z", []),
    ):
        stage_dir = results / run / "accuracy"
        stage_dir.mkdir(parents=True)
        for name in figures:
            (stage_dir / name).write_bytes(PNG + run.encode())
        record = replace(
            make_record("accuracy", run_id=run, ended_at=ended_at),
            tables={"deltas": Table(["task", "delta"], [[run, 0.01]])},
            artifacts={name: str(stage_dir / name) for name in figures},
        )
        write_record(results, record)
        result = update_adrs(adr_dir, results / run, commit_branch="adr")
        assert result.commit == repo.head.commit.hexsha
        assert not repo.is_dirty(untracked_files=True)
    figure = adr_dir / "assets" / "accuracy-cpu-accuracy_deltas.png"
    assert result.removed == (figure,) and figure in result.changed
    assert not figure.exists()
    assert "docs/adr/assets/accuracy-cpu-accuracy_deltas.png" in repo.git.show(
        "--name-status", "--format=", "HEAD"
    )
    assert "docs/adr/assets" not in repo.git.ls_files()


def test_missing_adr_directory(tmp_path: Path, results: Path) -> None:
    with pytest.raises(AdrError, match="does not exist"):
        update_adrs(tmp_path / "none", results)
    (tmp_path / "file").write_text("")
    with pytest.raises(AdrError, match="exists but is not a directory"):
        update_adrs(tmp_path / "file", results)
    with pytest.raises(ResultsError):
        update_adrs(tmp_path, tmp_path / "none")


def test_figures_are_copied_beside_the_adrs_and_embedded(adr_dir: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    stage_dir = results / "run-1" / "accuracy"
    stage_dir.mkdir(parents=True)
    png = stage_dir / "plot.png"
    png.write_bytes(PNG + b"first")
    record = make_record("accuracy")
    table = Table(["task", "delta"], [["kvb_piqa", 0.01]])
    record = replace(
        record,
        tables={"deltas": table},
        artifacts={"accuracy_deltas.png": str(png), "accuracy.json": str(stage_dir / "a.json")},
    )
    write_record(results, record)
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    update_adrs(adr_dir, results)
    text = (adr_dir / "0009-int8.md").read_text()
    assert "| kvb_piqa | 0.01 |" in text
    assert "![Figure: accuracy_deltas.png](assets/accuracy-cpu-accuracy_deltas.png)" in text
    copied = adr_dir / "assets" / "accuracy-cpu-accuracy_deltas.png"
    assert copied.read_bytes() == png.read_bytes()
    assert not (adr_dir / "assets" / "accuracy-accuracy.json").exists()  # only figures
    # A new figure makes the ADRs stale, though no text changed; the update copies it.
    png.write_bytes(PNG + b"second")
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
    assert block.startswith(f"The stage's own message: `{reason}`\n")
    assert "No resource use changed" not in block


FIGURE = "accuracy_deltas.png"


def _figure_record(results: Path, source: str) -> Path:
    """An accuracy record whose figure is ``source``, put into its file as a hostile or careless
    writer would, past `write_record`'s own check."""
    table = Table(["task", "delta"], [["kvb_piqa", 0.01]])
    path = write_record(results, replace(make_record("accuracy"), tables={"deltas": table}))
    data = json.loads(path.read_text())
    data["artifacts"] = {FIGURE: source}
    path.write_text(json.dumps(data))
    return path


def _outside_png(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.png"  # a valid PNG, so only where it lies is wrong
    secret.write_bytes(PNG + b"not the run's")
    return secret


def _set_up_figure(case: str, tmp_path: Path, run_dir: Path) -> str:
    """The artifact path of each case of a figure that must not be copied."""
    stage_dir = run_dir / "accuracy"
    stage_dir.mkdir(parents=True, exist_ok=True)
    if case == "relative-escape":
        _outside_png(tmp_path)
        return "../../secret.png"
    if case == "etc-passwd":
        return "../" * 20 + "etc/passwd"
    if case == "absolute-outside":
        return str(_outside_png(tmp_path))
    if case == "link-to-outside":
        (stage_dir / "plot.png").symlink_to(_outside_png(tmp_path))
        return "accuracy/plot.png"
    if case == "folder-link-to-outside":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "plot.png").write_bytes(PNG)
        (run_dir / "linked").symlink_to(elsewhere)
        return "linked/plot.png"
    if case == "a-folder":
        return "accuracy"
    if case == "a-fifo":
        os.mkfifo(stage_dir / "plot.png")
        return "accuracy/plot.png"
    if case == "not-a-png":
        (stage_dir / "plot.png").write_text("a text file named .png\n")
        return "accuracy/plot.png"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "relative-escape",
        "etc-passwd",
        "absolute-outside",
        "link-to-outside",
        "folder-link-to-outside",
        "a-folder",
        "a-fifo",
        "not-a-png",
    ],
)
def test_a_figure_outside_its_run_directory_or_not_a_png_is_refused_and_nothing_is_copied(
    adr_dir: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    results = tmp_path / "results"
    _figure_record(results, _set_up_figure(case, tmp_path, results / "run-1"))
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr_dir, results)
    assert code == 2
    assert_one_line_error(err, f"figure '{FIGURE}'")
    assert tree_hashes(tmp_path) == before
    assert not (adr_dir / "assets").exists()


def test_a_figure_over_the_size_cap_is_refused(
    adr_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("adrkit._writer.MAX_FIGURE_BYTES", len(PNG) + 10)
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    results = tmp_path / "results"
    (results / "run-1" / "accuracy").mkdir(parents=True)
    (results / "run-1" / "accuracy" / "plot.png").write_bytes(PNG + b"x" * 11)
    _figure_record(results, "accuracy/plot.png")
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr_dir, results)
    assert code == 2
    assert_one_line_error(err, "over the limit")
    assert tree_hashes(tmp_path) == before


def test_a_relative_artifact_path_is_read_from_the_run_directory_never_the_cwd(
    adr_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    results = tmp_path / "results"
    for folder, content in [(results / "run-1", b"the run's"), (tmp_path / "cwd", b"the cwd's")]:
        (folder / "accuracy").mkdir(parents=True)
        (folder / "accuracy" / "plot.png").write_bytes(PNG + content)
    _figure_record(results, "accuracy/plot.png")
    monkeypatch.chdir(tmp_path / "cwd")
    assert run_update(capsys, adr_dir, results) == (0, "")
    assert (adr_dir / "assets" / f"accuracy-cpu-{FIGURE}").read_bytes() == PNG + b"the run's"


def test_an_absolute_artifact_path_inside_the_run_directory_still_reads(
    adr_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Records written before artifact paths were relative name them absolutely.
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    results = tmp_path / "results"
    (results / "run-1" / "accuracy").mkdir(parents=True)
    png = results / "run-1" / "accuracy" / "plot.png"
    png.write_bytes(PNG + b"old record")
    _figure_record(results, str(png))
    assert run_update(capsys, adr_dir, results) == (0, "")
    assert (adr_dir / "assets" / f"accuracy-cpu-{FIGURE}").read_bytes() == png.read_bytes()


def test_write_record_names_artifacts_relative_to_the_run_so_the_run_folder_can_move(
    adr_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    monkeypatch.chdir(tmp_path)  # the stage names its artifacts relative to its cwd
    stage_dir = Path("results", "run-1", "accuracy")
    stage_dir.mkdir(parents=True)
    (stage_dir / "plot.png").write_bytes(PNG + b"moved")
    record = replace(
        make_record("accuracy"),
        artifacts={FIGURE: str(stage_dir / "plot.png"), "accuracy.json": str(stage_dir / "a.json")},
    )
    path = write_record(Path("results"), record)
    stored = json.loads(path.read_text())["artifacts"]
    assert stored == {FIGURE: "accuracy/plot.png", "accuracy.json": "accuracy/a.json"}

    store = tmp_path / "evidence" / "runs"
    shutil.move(tmp_path / "results", store)
    monkeypatch.chdir(adr_dir)
    assert run_update(capsys, adr_dir, store) == (0, "")
    assert (adr_dir / "assets" / f"accuracy-cpu-{FIGURE}").read_bytes() == PNG + b"moved"


def test_an_assets_folder_that_links_out_of_the_adr_directory_is_refused(
    adr_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (adr_dir / "0009-int8.md").write_text(ACCURACY_ADR)
    outside = tmp_path / "outside"
    outside.mkdir()
    (adr_dir / "assets").symlink_to(outside)
    results = tmp_path / "results"
    (results / "run-1" / "accuracy").mkdir(parents=True)
    (results / "run-1" / "accuracy" / "plot.png").write_bytes(PNG)
    _figure_record(results, "accuracy/plot.png")
    before = tree_hashes(tmp_path)
    code, err = run_update(capsys, adr_dir, results)
    assert code == 2
    assert_one_line_error(err, "not a link or a file")
    assert tree_hashes(tmp_path) == before


def test_an_adr_with_crlf_line_ends_keeps_them_everywhere(
    adr_dir: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = adr_dir / "0012-fork-audit.md"
    # Chinese, so the output shows that the CRLF front matter was read.
    path.write_bytes(ADR_EN.replace("lang: en", "lang: zh").replace("\n", "\r\n").encode())
    (adr_dir / "README.md").write_bytes(b"# an index saved with CRLF\r\n")
    before = path.read_bytes()
    assert run_update(capsys, adr_dir, results) == (0, "")
    after = path.read_bytes()
    assert "| 差异文件数 | 3 |".encode() in after
    assert human_text(after.decode()) == human_text(before.decode())
    for written in (after, (adr_dir / "README.md").read_bytes()):
        assert written.count(b"\n") == written.count(b"\r\n") > 5
    assert update_adrs(adr_dir, results, check=True).changed == ()


def test_an_lf_adr_stays_lf(adr_dir: Path, results: Path) -> None:
    update_adrs(adr_dir, results)
    assert b"\r" not in (adr_dir / "0012-fork-audit.md").read_bytes()
