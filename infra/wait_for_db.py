"""Wait, with backoff, until the database in PREFECT_API_DATABASE_CONNECTION_URL accepts
connections; exit 1 with one clear line if it never does.

Run before `prefect server start` (infra/systemd/prefect-server.service): an unreachable
database then gives a readable message and a paced retry, not a crash loop of tracebacks.

    python3 infra/wait_for_db.py [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0


def database_address(url: str) -> tuple[str, int] | None:
    """Host and port of a PostgreSQL URL; None for SQLite, which needs no waiting."""
    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite"):
        return None
    if not parts.scheme.startswith("postgresql"):
        msg = f"{ENV} has scheme {parts.scheme!r}; expected postgresql+asyncpg or sqlite"
        raise ValueError(msg)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def wait_for(host: str, port: int, timeout_s: float) -> int:
    """Try to connect until `timeout_s` has passed, doubling the delay; return attempts used."""
    deadline = time.monotonic() + timeout_s
    delay, attempts = FIRST_DELAY_S, 0
    while True:
        attempts += 1
        try:
            with socket.create_connection((host, port), timeout=5):
                return attempts
        except OSError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                msg = (
                    f"database at {host}:{port} unreachable after {attempts} attempts over "
                    f"{timeout_s:g} s: {exc.strerror or exc}"
                )
                raise TimeoutError(msg) from None
            pause = min(delay, left)
            print(
                f"database at {host}:{port} not reachable yet; retrying in {pause:.0f} s",
                file=sys.stderr,
            )
            time.sleep(pause)
            delay = min(delay * 2, MAX_DELAY_S)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    args = parser.parse_args(argv)
    try:
        address = database_address(os.environ.get(ENV, "sqlite+aiosqlite:///"))
        if address is not None:
            attempts = wait_for(*address, args.timeout)
            print(f"database at {address[0]}:{address[1]} reachable (attempt {attempts})")
    except (ValueError, TimeoutError) as exc:
        print(f"wait_for_db: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
