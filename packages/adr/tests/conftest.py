from __future__ import annotations

from pathlib import Path

import pytest

from adrkit import Gate, Provenance, Record, Table, write_record

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
        metrics={"files_total": files_total, "fork": "git:/tmp/fork@HEAD"},
        tables={"findings": Table(["stream", "path", "reason"], [["B", "vllm/envs.py", "env"]])},
        gates=[Gate.judge("vendor_risk_changes", 0.0, "<=", 0.0)],
        artifacts={"report": "audit.md"},
        provenance=Provenance(
            run_id=run_id,
            started_at="2026-11-29T01:59:00.000000Z",
            ended_at=ended_at,
            repo_commit="0123456789abcdef0123",
            flow_run_id="flow-run-xyz",
        ),
    )


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
