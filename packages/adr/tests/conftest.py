from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest

from adrkit import write_record
from adrkit.__main__ import main
from adrkit.schema import Gate, Provenance, Record, Table

ADR_EN = """\
---
status: accepted
date: 2026-11-29
lang: en
---
# 0012 Vendor fork audit

Human words stay   exactly as written.\t

<!-- generated:audit-summary begin -->
old summary
<!-- generated:audit-summary end -->

More human text, with trailing spaces\x20\x20
<!-- generated:pipeline-status begin -->
<!-- generated:pipeline-status end -->
Last line without newline"""

# An ADR with the block that embeds the accuracy stage's figure.
ACCURACY_ADR = (
    "---\nlang: en\n---\n# 0009 INT8\n"
    "<!-- generated:kvbench-accuracy begin -->\n<!-- generated:kvbench-accuracy end -->\n"
)


def make_record(
    stage: str = "audit",
    *,
    run_id: str = "run-1",
    ended_at: str = "2026-11-29T02:00:00.000000Z",
    status: str = "passed",
    summary: str = "no surprise patch",
    reason: str | None = None,
    files_total: int = 3,
) -> Record:
    return Record(
        stage=stage,
        status=status,  # type: ignore[arg-type]
        summary=summary,
        reason=reason,
        metrics={"files_total": files_total, "fork": "git:../fork@HEAD"},
        tables={"findings": Table(["stream", "path", "reason"], [["B", "vllm/envs.py", "env"]])},
        gates=[Gate.judge("vendor_risk_changes", 0.0, "<=", 0.0)],
        provenance=Provenance(
            run_id=run_id,
            started_at="2026-11-29T01:59:00.000000Z",
            ended_at=ended_at,
            repo_commit="0123456789abcdef0123",
            flow_run_id="flow-run-xyz",
        ),
    )


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in a folder of its own: `adrkit update` reads `.results` from the working
    directory when given no `--results`, and the working tree's (a nightly's, say) is no
    test's input unless the test says so (test_working_tree_state.py plants one)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def adr_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "adr"
    directory.mkdir()
    (directory / "0012-fork-audit.md").write_text(ADR_EN, encoding="utf-8")
    return directory


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    write_record(root, make_record())
    return root


# A real PNG signature and header chunk's start: enough for the writer's type check.
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"

HUMAN = re.compile(r"<!-- generated:(\S+) begin -->.*?<!-- generated:\1 end -->", re.DOTALL)


def human_text(text: str) -> list[str]:
    """Everything outside block bodies, markers included, line ends kept."""
    return HUMAN.sub(lambda m: m.group(0).split("\n", 1)[0] + m.group(1), text).splitlines(True)


def tree_hashes(*roots: Path) -> dict[str, str]:
    """Every file, folder and link under ``roots``, with a hash of each file's bytes, so that a
    comparison catches any file written, created, removed or replaced."""
    found: dict[str, str] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                path = Path(folder, name)
                if path.is_symlink():
                    found[str(path)] = f"link to {path.readlink()}"
                elif path.is_dir():
                    found[str(path)] = "folder"
                elif path.is_file():
                    found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    found[str(path)] = "special file"
    return found


def run_update(
    capsys: pytest.CaptureFixture[str], adr_dir: Path, results: Path, *extra: str
) -> tuple[int, str]:
    """`adrkit update` through its `main`, as the command line runs it: exit code and stderr."""
    capsys.readouterr()
    code = main(["update", "--adr-dir", str(adr_dir), "--results", str(results), *extra])
    return code, capsys.readouterr().err


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("adrkit: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def python_env(**variables: str) -> dict[str, str]:
    """The environment of a subprocess that imports this adrkit (and this conftest)."""
    paths = [str(Path(__file__).parent), *sys.path]
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths)} | variables
