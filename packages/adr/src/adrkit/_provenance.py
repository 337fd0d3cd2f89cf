"""Provenance: which code, which packages and which machine produced a record."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import secrets
from datetime import UTC, datetime
from pathlib import Path

import git

from adrkit.schema import Scalar


def utc_now() -> str:
    """A UTC timestamp that sorts as text, which `load_latest` relies on."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """A run id that sorts by start time and stays unique across machines."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def repo_state(path: Path) -> tuple[str | None, bool | None]:
    """The commit checked out at ``path`` and whether its work tree is dirty, if it is a repo."""
    try:
        repo = git.Repo(path, search_parent_directories=True)
        return repo.head.commit.hexsha, repo.is_dirty(untracked_files=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return None, None


def package_versions(names: list[str]) -> dict[str, str]:
    """Installed versions of ``names``; a missing package is recorded as such, not skipped."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def hardware() -> dict[str, Scalar]:
    """The machine, as far as the standard library can tell without a GPU runtime."""
    return {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
