"""Update the generated blocks of every ADR in a directory from the latest results records.

The update is all-or-nothing in what it checks: every ADR is parsed and every block rendered
before the first byte is written, so a malformed marker or an unknown block key anywhere leaves
every file as it was. Each file is then replaced atomically (temp file, fsync, rename), and the
whole update runs under a file lock, so concurrent writers serialise instead of losing updates; the
temp files of a writer killed before its rename are removed by the next update.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import filelock
import git

from adrkit import _document
from adrkit._blocks import Records, asset_name, is_figure, render_block
from adrkit._errors import AdrError, CommitError
from adrkit._files import atomic_write, remove_stale_temps
from adrkit._record import load_latest

INDEX_NAME = "README.md"
ADR_GLOB = "[0-9][0-9][0-9][0-9]-*.md"
LOCK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class UpdateResult:
    """What an update changed (or, with ``check``, would change)."""

    changed: tuple[Path, ...]
    commit: str | None = None

    @property
    def stale(self) -> bool:
        return bool(self.changed)


def lock_for(adr_dir: Path) -> filelock.FileLock:
    """The lock that serialises writers of one ADR directory.

    It lives in the temp directory, keyed by the directory's real path, so it never shows up as
    an untracked file in the repository that holds the ADRs.
    """
    digest = hashlib.sha256(str(adr_dir.resolve()).encode()).hexdigest()[:16]
    return filelock.FileLock(Path(tempfile.gettempdir()) / f"adrkit-{digest}.lock")


def update_adrs(
    adr_dir: Path,
    results: Path,
    *,
    check: bool = False,
    commit_branch: str | None = None,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> UpdateResult:
    """Render every generated block in ``adr_dir`` from the latest records under ``results``.

    With ``check``, nothing is written and the result lists the files that are stale. With
    ``commit_branch``, the change is committed with GitPython on that branch, which must be the
    one checked out, and only if the work tree was clean before the update. If another writer
    holds the directory's lock for more than ``lock_timeout_s`` seconds, the update fails and
    writes nothing.
    """
    if not adr_dir.is_dir():
        problem = "exists but is not a directory" if adr_dir.exists() else "does not exist"
        msg = f"ADR directory {adr_dir} {problem}"
        raise AdrError(msg)
    repo = _repo_for_commit(adr_dir, commit_branch) if commit_branch and not check else None
    try:
        held = lock_for(adr_dir).acquire(timeout=lock_timeout_s)
    except filelock.Timeout:
        msg = (
            f"another adrkit update is holding the lock on {adr_dir} (waited {lock_timeout_s:g} s)"
        )
        raise AdrError(msg) from None
    with held:
        records = load_latest(results)
        planned = _plan(adr_dir, records)
        changed = tuple(path for path, content in planned.items() if _read(path) != content)
        if check:
            return UpdateResult(changed)
        for path in planned:
            remove_stale_temps(path)
        if not changed:
            return UpdateResult(changed)
        for path in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, planned[path])
        commit = _commit(repo, changed, records) if repo is not None else None
    return UpdateResult(changed, commit)


def _read(path: Path) -> str | bytes | None:
    try:
        return path.read_bytes() if is_figure(path.name) else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _plan(adr_dir: Path, records: Records) -> dict[Path, str | bytes]:
    """The new text of every ADR and of the index, and the figures the records carry (copied
    beside the ADRs, where the blocks link them), computed before anything is written."""
    paths = sorted(adr_dir.glob(ADR_GLOB))
    if not paths:
        # The index would replace whatever README.md is there, e.g. a project's own README when
        # the directory is a mistake, so a directory without ADRs gets no index either.
        msg = f"no ADRs (NNNN-*.md) in {adr_dir}"
        raise AdrError(msg)
    documents = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"cannot read ADR {path}: {exc}"
            raise AdrError(msg) from None
        documents.append(_document.parse(path, text))
    planned: dict[Path, str | bytes] = {
        doc.path: doc.with_bodies(
            {b.key: render_block(b.key, records, doc.lang) for b in doc.blocks}
        )
        for doc in documents
    }
    planned[adr_dir / INDEX_NAME] = render_index(documents)
    for stage, record in records.items():
        for name, source in record.artifacts.items():
            # A figure whose file is gone (results moved elsewhere) keeps its last copy.
            if is_figure(name) and Path(source).is_file():
                planned[adr_dir / asset_name(stage, name)] = Path(source).read_bytes()
    return planned


def render_index(documents: list[_document.Document]) -> str:
    """docs/adr/README.md: one row per ADR with its title, status and date."""
    rows = [
        f"| [{doc.path.stem[:4]}]({doc.path.name}) | {doc.title} | "
        f"{doc.front_matter.get('status', '—')} | {doc.front_matter.get('date', '—')} |"
        for doc in documents
    ]
    return "\n".join(
        [
            "# Architecture Decision Records",
            "",
            "<!-- This index is generated by `adrkit update`; edit the ADRs, not this file. -->",
            "",
            "| ADR | Title | Status | Date |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _repo_for_commit(adr_dir: Path, branch: str) -> git.Repo:
    """The repository to commit in, checked before anything is written."""
    try:
        repo = git.Repo(adr_dir, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        msg = f"cannot commit: {adr_dir} is not inside a git checkout"
        raise CommitError(msg) from None
    if repo.bare:
        msg = f"cannot commit: {repo.git_dir} is a bare repository"
        raise CommitError(msg)
    if repo.is_dirty(index=True, working_tree=True, untracked_files=False):
        msg = f"cannot commit: the work tree of {repo.working_dir} has uncommitted changes"
        raise CommitError(msg)
    if repo.head.is_detached or repo.active_branch.name != branch:
        current = "a detached HEAD" if repo.head.is_detached else repo.active_branch.name
        msg = f"cannot commit to branch {branch!r}: the checkout is on {current}"
        raise CommitError(msg)
    return repo


def _commit(repo: git.Repo, changed: tuple[Path, ...], records: Records) -> str:
    runs = sorted({r.provenance.run_id for r in records.values()})
    repo.index.add([str(p.resolve()) for p in changed])
    message = f"docs(adr): update generated blocks from run {', '.join(runs)}"
    return repo.index.commit(message).hexsha
