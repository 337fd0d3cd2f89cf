"""Replacing and removing a set of files in a directory so that the set changes as a whole, even
when the writer is killed between its renames.

Each file is replaced by a rename, which is atomic, but an update renames several files, and a
writer killed between two renames would leave some ADRs new and some old. So the renames are
written down first: every new file is written to a temp file beside its target and synced, then
a journal listing the renames is written atomically into the directory (the commit point), then
the files are renamed, the files to remove (the journal lists them too) are removed, and the
journal is removed. A writer killed before the journal exists changed nothing, and its temp files
are removed by the next writer; one killed after it has committed to the whole set, and the next
writer, before anything else, does the renames and removals it did not get to (`roll_forward`).
A journal without a list of removals removes nothing. Only figures are ever removed, so a journal
that lists any other file is refused, as one that renames anything but a temp file over its
target is. Only the holder of the directory's lock may call either function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath

from adrkit._errors import AdrError
from adrkit._files import (
    FileReadError,
    atomic_write,
    fsync_directory,
    is_temp_of,
    read_capped,
    write_temp,
)
from adrkit._layout import is_figure_name

JOURNAL_NAME = ".adrkit-journal.json"
# A journal lists a few dozen renames; anything this large was not written by adrkit.
MAX_JOURNAL_BYTES = 2**20

Renames = list[tuple[Path, Path]]


def replace_all(
    directory: Path, contents: Mapping[Path, bytes], removals: Collection[Path] = ()
) -> None:
    """Replace every file of ``contents`` and remove every figure of ``removals`` (paths in
    ``directory`` or a folder in it, none in both) as one set."""
    temps: dict[Path, Path] = {}
    committed = False
    try:
        for target, data in contents.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            temps[target] = write_temp(target, data)
        renames = [(temp, target) for target, temp in temps.items()]
        for folder in _folders(directory, list(temps)):
            fsync_directory(folder)  # the temp files exist on disk before the journal names them
        journal = {
            "renames": [[_relative(directory, p) for p in pair] for pair in renames],
            "removals": [_relative(directory, p) for p in removals],
        }
        atomic_write(directory / JOURNAL_NAME, json.dumps(journal).encode())
        committed = True
        _complete(directory, renames, list(removals))
    except OSError as exc:
        if not committed:
            for temp in temps.values():
                temp.unlink(missing_ok=True)
            msg = f"cannot write the ADRs in {directory}: {exc}; no file was changed"
        else:
            msg = (
                f"the update of {directory} stopped after it was committed: {exc}; "
                "the next adrkit update completes it"
            )
        raise AdrError(msg) from None
    except BaseException:
        if not committed:
            for temp in temps.values():
                temp.unlink(missing_ok=True)
        raise


def roll_forward(directory: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Complete the update a killed writer committed to, if any; return the files it replaces
    and those it removes."""
    journal = directory / JOURNAL_NAME
    if not journal.exists():
        return (), ()
    renames, removals = _read(directory, journal)
    replaced = tuple(target for temp, target in renames if temp.exists())
    removed = tuple(path for path in removals if os.path.lexists(path))
    try:
        _complete(directory, renames, removals)
    except OSError as exc:
        msg = f"cannot complete the interrupted update that {journal} records: {exc}"
        raise AdrError(msg) from None
    return replaced, removed


def _complete(directory: Path, renames: Renames, removals: list[Path]) -> None:
    for temp, target in renames:
        try:
            temp.replace(target)
        except FileNotFoundError:  # renamed before the writer was killed
            continue
    for path in removals:
        path.unlink(missing_ok=True)  # gone already if removed before the writer was killed
    for folder in _folders(directory, [target for _, target in renames] + removals):
        fsync_directory(folder)  # every rename and removal is on disk before the journal goes
    # Not synced: a journal that comes back after a crash names temp files that are gone, and
    # the next writer only removes it.
    (directory / JOURNAL_NAME).unlink()


def _folders(directory: Path, paths: list[Path]) -> list[Path]:
    return sorted({directory, *(path.parent for path in paths)})


def _relative(directory: Path, path: Path) -> str:
    return path.relative_to(directory).as_posix()


def _read(directory: Path, journal: Path) -> tuple[Renames, list[Path]]:
    """The renames and removals ``journal`` lists, each checked to stay within ``directory``."""
    try:
        data = json.loads(read_capped(journal, MAX_JOURNAL_BYTES).decode("utf-8"))
        pairs = data["renames"]
        renames = [(_inside(directory, temp), _inside(directory, target)) for temp, target in pairs]
        removals = [_inside(directory, name) for name in data.get("removals", [])]
    except (FileReadError, ValueError, RecursionError, KeyError, TypeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        bad = [(temp, target) for temp, target in renames if not is_temp_of(temp, target)]
        foreign = [path for path in removals if not is_figure_name(path.name)]
        if not bad and not foreign:
            return renames, removals
        if bad:
            reason = f"{bad[0][0]} is not a temp file of {bad[0][1]}"
        else:
            reason = f"it removes {foreign[0]}, which is no figure"
    msg = (
        f"{journal} is not a journal of adrkit's ({reason}); if no update is running, "
        "check the ADRs and delete it"
    )
    raise AdrError(msg)


def _inside(directory: Path, name: object) -> Path:
    """``directory / name`` for a relative path ``name`` that no link or `..` takes outside it."""
    if not isinstance(name, str):
        msg = f"a path must be a string, got {name!r}"
        raise TypeError(msg)
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        msg = f"{name!r} is not a path inside the directory"
        raise ValueError(msg)
    path = directory.joinpath(*relative.parts)
    unlinked = Path(os.path.realpath(directory)).joinpath(*relative.parts[:-1])
    if Path(os.path.realpath(path.parent)) != unlinked:
        msg = f"{name!r} is not a path inside the directory (a folder on its way is a link)"
        raise ValueError(msg)
    return path
