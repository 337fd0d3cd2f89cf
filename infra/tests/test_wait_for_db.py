"""infra/wait_for_db.py against a closed port and a listening one, as systemd runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "wait_for_db.py"


def _run(url: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout", str(timeout)],
        env={**os.environ, "PREFECT_API_DATABASE_CONNECTION_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unreachable_database_is_one_clear_line_after_backoff() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        done = _run(f"postgresql+asyncpg://prefect:secret@127.0.0.1:{port}/prefect", 4)
    assert done.returncode == 1
    assert time.monotonic() - started >= 3.5  # it waited, retrying, for the whole timeout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"wait_for_db: error: database at 127.0.0.1:{port} unreachable after")
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr  # the password never reaches the journal
    retries = [line for line in done.stderr.splitlines() if "retrying in" in line]
    assert len(retries) >= 2


def test_listening_database_and_sqlite_pass(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        done = _run(f"postgresql+asyncpg://p@127.0.0.1:{sock.getsockname()[1]}/p", 5)
    assert done.returncode == 0, done.stderr
    assert "reachable (attempt 1)" in done.stdout
    assert _run(f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", 1).returncode == 0
    bad = _run("mysql://x@127.0.0.1/x", 1)
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        "wait_for_db: error: PREFECT_API_DATABASE_CONNECTION_URL has scheme 'mysql'; "
        "expected postgresql+asyncpg or sqlite"
    )
