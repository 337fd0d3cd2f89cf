"""Update the generated blocks of every ADR in a directory from the latest results records.

The update is all-or-nothing in what it checks: every ADR is parsed, every block rendered and
every figure checked before the first byte is written, so a malformed marker, an unknown block key
or a bad record anywhere leaves every file as it was. The whole update runs under the ADR
directory's lock, so concurrent writers serialise instead of losing updates, and the files change
as one set (`_journal`): a writer killed midway leaves either the old set or a journal that the
next update completes first; the temp files of a writer killed earlier are removed. The set
includes the removal of the figures adrkit copied that no record names any more, beside the ADRs
and in the evidence store (`adrkit._figures`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import git

from adrkit import _document, _journal
from adrkit._errors import AdrError, CommitError, ResultsError
from adrkit._evidence import (
    Evidence,
    collect,
    evidence_dir,
    load_hardware,
    read_source,
    read_store,
    stored_path,
    to_store,
)
from adrkit._figures import ASSETS_DIR, asset_name, stale_assets, stale_stored_figures
from adrkit._files import FileReadError, read_capped, remove_stale_temps
from adrkit._freshness import load_sources
from adrkit._layout import figure_signature, is_real_folder, listing
from adrkit._lock import DirectoryLock
from adrkit._markdown import markdown_text
from adrkit._record import RECORD_SUFFIX, RecordFile, artifact_in_run_dir
from adrkit._render import Shown, render_block
from adrkit._summary import load_decisions
from adrkit.schema import Record

INDEX_NAME = "README.md"
ADR_GLOB = "[0-9][0-9][0-9][0-9]-*.md"
LOCK_TIMEOUT_S = 120.0
# The largest ADR, with the generated tables of an audit of a whole vLLM tree, is well under
# 1 MiB. The writer refuses to read a larger one, and so also to write one.
MAX_ADR_BYTES = 2**20
# The pipeline's figures are plots of some 100 KiB; a larger file is none of them, and a copy
# would be committed into the repository.
MAX_FIGURE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class UpdateResult:
    """What an update changed (or, with ``check``, would change): every file written or removed,
    and those of them removed."""

    changed: tuple[Path, ...]
    commit: str | None = None
    removed: tuple[Path, ...] = ()

    @property
    def stale(self) -> bool:
        return bool(self.changed)


def lock_for(adr_dir: Path) -> DirectoryLock:
    """The lock that serialises writers of one ADR directory (see `adrkit._lock`)."""
    return DirectoryLock(adr_dir)


def update_adrs(
    adr_dir: Path,
    results: Path | None,
    *,
    check: bool = False,
    commit_branch: str | None = None,
    store: Path | None = None,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> UpdateResult:
    """Render every generated block in ``adr_dir`` from the evidence: the records under
    ``results`` (a results root or one run; None: the evidence store alone) and those of the
    evidence store.

    With ``store``, a results directory, its newest record of each stage and hardware class goes
    into the evidence store first, unless the store holds a newer one (see `adrkit._evidence`);
    the records and the ADRs change as one set. With ``check``, nothing is written and the result
    lists the files that are stale. With ``commit_branch``, the change is committed with GitPython
    on that branch, which must be the one checked out, and only if the work tree is clean before
    the update. If another writer holds the directory's lock for more than ``lock_timeout_s``
    seconds, the update fails and writes nothing. The figures adrkit copied beside the ADRs or
    into the store that no record shown or stored names any more are removed in the same set
    (see `adrkit._figures`). An update that a killed writer committed to is completed first,
    even by an update that then refuses its own input: completing it is no change of this
    update's.
    """
    if not adr_dir.is_dir():
        problem = "exists but is not a directory" if adr_dir.exists() else "does not exist"
        msg = f"ADR directory {adr_dir} {problem}"
        raise AdrError(msg)
    for given, what in ((results, "results directory"), (store, "results directory to store")):
        if given is not None and not given.is_dir():
            problem = "exists but is not a directory" if given.exists() else "does not exist"
            msg = f"{what} {given} {problem}"
            raise ResultsError(msg)
    with lock_for(adr_dir).acquire(timeout=lock_timeout_s):
        repo = _repo_for_commit(adr_dir, commit_branch) if commit_branch and not check else None
        completed: tuple[Path, ...] = ()
        completed_removals: tuple[Path, ...] = ()
        if not check:
            completed, completed_removals = _journal.roll_forward(adr_dir)
            for folder in _written_folders(adr_dir):
                remove_stale_temps(folder)
        stored = read_store(adr_dir)
        incoming = to_store(adr_dir, read_source(store)) if store is not None else []
        shown_files = [*(read_source(results) if results is not None else []), *stored, *incoming]
        evidence = collect(shown_files)
        if not evidence:
            sources = [str(p) for p in (results, store) if p is not None]
            msg = (
                f"no results records (*{RECORD_SUFFIX}) in "
                f"{', '.join([*sources, str(evidence_dir(adr_dir))])}"
            )
            raise ResultsError(msg)
        shown = Shown(
            evidence, load_hardware(adr_dir), load_decisions(adr_dir), load_sources(adr_dir)
        )
        store_files, now_stored = _store_plan(adr_dir, incoming)
        planned = _plan(adr_dir, shown) | store_files
        # What the store holds once this update is done: its records, each replaced by the
        # incoming one of its place.
        held = {found.path: found for found in stored} | {f.path: f for f in now_stored}
        known = [c.id for c in shown.hardware.classes] + [f.path.parent.name for f in stored]
        removals = tuple(
            stale_assets(adr_dir, evidence, known) + stale_stored_figures(adr_dir, held.values())
        )
        written = tuple(path for path, content in planned.items() if _current(path) != content)
        if check:
            return UpdateResult((*written, *removals), removed=removals)
        if written or removals:
            _journal.replace_all(adr_dir, {path: planned[path] for path in written}, removals)
        written = tuple(dict.fromkeys([*written, *completed]))
        removed = tuple(
            p for p in dict.fromkeys([*removals, *completed_removals]) if p not in written
        )
        changed = (*written, *removed)
        commit = None
        if repo is not None and changed:
            shown_records = {f.record.provenance.run_id: f.record for f in evidence.all_files()}
            commit = _commit(repo, written, removed, shown_records)
    return UpdateResult(changed, commit, removed)


def _written_folders(adr_dir: Path) -> list[Path]:
    """The folders an update writes into, where a killed writer's temp files may lie."""
    store = evidence_dir(adr_dir)
    folders = [adr_dir, adr_dir / ASSETS_DIR, store]
    if store.is_dir() and not store.is_symlink():
        for class_dir in listing(store):
            if is_real_folder(class_dir):
                folders += [class_dir, *(p for p in listing(class_dir) if is_real_folder(p))]
    return [f for f in folders if f.is_dir() and not f.is_symlink()]


def _store_plan(
    adr_dir: Path, incoming: list[RecordFile]
) -> tuple[dict[Path, bytes], list[RecordFile]]:
    """The evidence store's new records and their figures, each figure checked as the ADRs'
    own are, and the new records as the store will hold them; a record keeps only its figures
    (`adrkit._evidence`)."""
    planned: dict[Path, bytes] = {}
    records: list[RecordFile] = []
    for found in incoming:
        target = stored_path(adr_dir, found.record)
        figures = {}
        for name, source in found.record.artifacts.items():
            signature = figure_signature(name)
            if signature is None:
                continue
            data = _figure(found, name, Path(source), signature)
            if data is not None:
                figures[name] = data
        for name, data in figures.items():
            planned[target.parent / found.record.stage / name] = data
        kept = {name: f"{found.record.stage}/{name}" for name in sorted(figures)}
        record = replace(found.record, artifacts=kept)
        planned[target] = (json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n").encode()
        records.append(RecordFile(target, record))
    _check_inside(adr_dir, planned)
    return planned, records


def _check_inside(adr_dir: Path, planned: dict[Path, bytes]) -> None:
    """Refuse a planned file whose folder is a link or a file: the store lives in the ADR
    directory, and a link there would send its writes elsewhere."""
    for path in planned:
        for folder in path.relative_to(adr_dir).parents:
            real = adr_dir / folder
            if folder != Path() and (real.is_symlink() or (real.exists() and not real.is_dir())):
                msg = f"{real} must be a directory in {adr_dir}, not a link or a file"
                raise AdrError(msg)


def _current(path: Path) -> bytes | None:
    """The bytes a planned file has now, None if there is none yet."""
    if not os.path.lexists(path):
        return None
    try:
        return read_capped(path, max(MAX_ADR_BYTES, MAX_FIGURE_BYTES))
    except FileReadError as exc:
        msg = f"cannot replace {path}: {exc}"
        raise AdrError(msg) from None


def _plan(adr_dir: Path, shown: Shown) -> dict[Path, bytes]:
    """The new bytes of every ADR and of the index, and the figures of the records shown
    (copied beside the ADRs, where the blocks link them), computed before anything is written."""
    paths = sorted(adr_dir.glob(ADR_GLOB))
    if not paths:
        # The index would replace whatever README.md is there, e.g. a project's own README when
        # the directory is a mistake, so a directory without ADRs gets no index either.
        msg = f"no ADRs (NNNN-*.md) in {adr_dir}"
        raise AdrError(msg)
    documents = [_document.parse(path, _read_adr(path)) for path in paths]
    planned: dict[Path, bytes] = {
        doc.path: doc.with_bodies(
            {b.key: render_block(b.key, shown, doc.lang) for b in doc.blocks}
        ).encode("utf-8")
        for doc in documents
    }
    index = adr_dir / INDEX_NAME
    planned[index] = render_index(documents, _document.newline_of(_index_text(index))).encode()
    for path, content in planned.items():
        if len(content) > MAX_ADR_BYTES:
            msg = (
                f"{path} would be {len(content)} bytes, over the limit of {MAX_ADR_BYTES} that "
                "adrkit reads; the records' tables are too large for an ADR"
            )
            raise AdrError(msg)
    planned |= _figures(adr_dir, shown.evidence)
    return planned


def _read_adr(path: Path) -> str:
    try:
        # Bytes, decoded without newline translation, so a CR is kept wherever it stands.
        return read_capped(path, MAX_ADR_BYTES).decode("utf-8")
    except (FileReadError, UnicodeDecodeError) as exc:
        msg = f"cannot read ADR {path}: {exc}"
        raise AdrError(msg) from None


def _index_text(index: Path) -> str:
    """The current index, whose line ends the new one keeps; empty if there is none."""
    current = _current(index)
    return current.decode("utf-8", errors="replace") if current is not None else ""


def _figures(adr_dir: Path, evidence: Evidence) -> dict[Path, bytes]:
    """The figures to copy beside the ADRs, each checked to be a file of the record's own run
    directory and of the type its name says. A figure whose file is gone (the results were
    moved or pruned) keeps its last copy: the ADR still links it, and it is still the figure of
    the record the block shows."""
    figures: dict[Path, bytes] = {}
    for found in evidence.all_files():
        for name, source in found.record.artifacts.items():
            signature = figure_signature(name)
            if signature is None:
                continue
            data = _figure(found, name, Path(source), signature)
            if data is not None:
                figures[adr_dir / asset_name(found.record, name)] = data
    assets = adr_dir / ASSETS_DIR
    if figures and (assets.is_symlink() or (assets.exists() and not assets.is_dir())):
        msg = f"{assets} must be a directory in {adr_dir}, not a link or a file"
        raise AdrError(msg)
    return figures


def _figure(found: RecordFile, name: str, source: Path, signature: bytes) -> bytes | None:
    where = f"figure {name!r} of results record {found.path}"
    inside = artifact_in_run_dir(found.run_dir, source)
    if inside is None:
        msg = f"{where} is {source}, which resolves outside its run directory {found.run_dir}"
        raise AdrError(msg)
    resolved = found.run_dir.resolve() / inside
    if not os.path.lexists(resolved):
        return None
    try:
        # Not through a link: the path was resolved just now, and a link put there since would
        # lead elsewhere.
        data = read_capped(resolved, MAX_FIGURE_BYTES, follow_links=False)
    except FileReadError as exc:
        msg = f"cannot copy {where} ({resolved}): {exc}"
        raise AdrError(msg) from None
    if not data.startswith(signature):
        kind = Path(name).suffix.lstrip(".").upper()
        msg = f"{where} ({resolved}) is not a {kind} file (it lacks the {kind} signature)"
        raise AdrError(msg)
    return data


def render_index(documents: list[_document.Document], newline: str = "\n") -> str:
    """docs/adr/README.md: one row per ADR with its title, status and date."""
    rows = [
        f"| [{doc.path.stem[:4]}]({quote(doc.path.name)}) | {markdown_text(doc.title)} | "
        f"{markdown_text(doc.front_matter.get('status', '—'))} | "
        f"{markdown_text(doc.front_matter.get('date', '—'))} |"
        for doc in documents
    ]
    return newline.join(
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


def _commit(
    repo: git.Repo,
    written: tuple[Path, ...],
    removed: tuple[Path, ...],
    records: dict[str, Record],
) -> str:
    runs = sorted({r.provenance.run_id for r in records.values()})
    if written:
        repo.index.add([str(p.resolve()) for p in written])
    if removed:
        # A figure copied and never committed is gone from the work tree, and nothing more.
        repo.index.remove([str(p.resolve()) for p in removed], ignore_unmatch=True)
    message = f"docs(adr): update generated blocks from run {', '.join(runs)}"
    return repo.index.commit(message).hexsha
