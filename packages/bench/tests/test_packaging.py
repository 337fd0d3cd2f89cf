"""A plain (non-editable) install carries every file of the source package.

The worker images install kvbench with `pip install ./packages/bench`, not editable, so the
embedded configs, the offline task files and the migrations must be in the wheel, or a GPU node
fails where the editable checkout worked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SOURCE = PACKAGE_DIR / "src" / "kvbench"


def _source_files() -> set[str]:
    return {
        path.relative_to(SOURCE.parent).as_posix()
        for path in SOURCE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_wheel_ships_every_source_file(tmp_path: Path) -> None:
    # Built from a copy: pip builds in the tree it is given and would leave build/ behind.
    tree = tmp_path / "bench"
    shutil.copytree(
        PACKAGE_DIR, tree, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    # The package's own build backend (setuptools, isolated as a user's pip install runs it).
    wheels = tmp_path / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels)]
    subprocess.run([*pip_wheel, str(tree)], check=True)
    (wheel,) = wheels.glob("kvbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("kvbench/")}
    source = _source_files()
    assert "kvbench/accuracy/cpu_nightly.toml" in source
    assert "kvbench/accuracy/tasks/kvb_data.py" in source
    assert sorted(source - shipped) == []
