"""Checks that an output folder or file can be written, made before any slow work starts: the
one check of kvquant's command line and build, and of kvbench's, which uses kvquant.

Nothing is created here: a folder or file that does not exist yet is made when the results are
written, so a run refused for another reason leaves no trace.
"""

from __future__ import annotations

import os
from pathlib import Path


def _nearest_existing(path: Path) -> Path:
    """``path`` or the closest of its parents that exists; ``path`` is absolute, so ``/`` does."""
    return next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())


def output_problem(path: Path, label: str, *, folder: bool) -> str | None:
    """Why ``path`` cannot be written as a folder (``folder``) or a file; None when it can.

    The reason is one line starting with ``label`` and the path, e.g. ``--json out/r.json``.
    """
    absolute = path.resolve()
    existing = _nearest_existing(absolute)
    if existing == absolute:
        if folder and not absolute.is_dir():
            return f"{label} {path} is a file; expected a folder"
        if not folder and absolute.is_dir():
            return f"{label} {path} is a folder; expected a file path"
        if not os.access(absolute, os.W_OK):
            return f"{label} {path} is not writable"
        return None
    if not existing.is_dir():
        return f"{label} {path} cannot be created: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{label} {path} cannot be created: {existing} is not writable"
    return None
