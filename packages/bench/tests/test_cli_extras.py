"""Each `kvbench` command runs where only its own extra is installed, and a command whose extra
is missing says so in one line. A subprocess hides the other extra's modules from the import
system, as an environment that never installed them would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_RUN_HIDING = """
import sys

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Uninstalled())
from kvbench.__main__ import main
sys.exit(main({argv!r}))
"""


def _kvbench(hidden: set[str], *argv: str) -> subprocess.CompletedProcess[str]:
    code = _RUN_HIDING.format(hidden=hidden, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_accuracy_starts_without_the_throughput_extra() -> None:
    result = _kvbench({"sqlalchemy", "alembic"}, "accuracy", "--help")
    assert result.returncode == 0, result.stderr
    assert "--limit" in result.stdout


def test_a_missing_extra_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    result = _kvbench({"sqlalchemy"}, "history", "--history", f"sqlite:///{tmp_path}/h.sqlite3")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kvbench history: error: No module named 'sqlalchemy'; the 'throughput' extra installs "
        "what it needs: pip install 'kvbench[throughput]'"
    ]
