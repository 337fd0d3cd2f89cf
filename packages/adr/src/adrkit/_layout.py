"""Where records lie: the layout of a results root, of a run folder and of the evidence store, and
the record files each holds. Anything that is not where its layout says is an error naming it,
never something to skip or to guess around: one stray JSON file once made a results root read as
a run folder (and the evidence store as a class folder), hiding every run and every class, and an
update then dropped their evidence from the ADRs.

- A results root holds run folders (`<run id>/`, real folders, not links) and files that are
  not records (the throughput history, say); never a `*.json` of its own.
- A run folder holds records (`<stage>.json`, regular files) and their artifacts: its stages'
  folders (`<stage>/`) and whatever else a stage writes, but no run folder (one holding a record
  of the run it is named for). A folder passed as results is a run folder when it holds a
  `*.json` itself, a results root otherwise.
- The evidence store holds class folders (`<class>/`), each with records (`<stage>.json`) and
  their figures (`<stage>/<figure>.png`), and nothing else but adrkit's own temp files, which a
  killed writer leaves and the next update removes.

A folder that cannot be listed is one line too. What a record holds (its stage matching its file
name, its hardware class its folder) is checked by the reader (`adrkit._evidence`).
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from adrkit._errors import ResultsError
from adrkit._files import TEMP_SUFFIX
from adrkit._record import RECORD_SUFFIX, read_record
from adrkit.schema import is_artifact_name

# The figure types a block embeds, by the name's suffix, and the bytes such a file begins with:
# a figure is copied beside the ADRs only if its content is of the type its name says.
FIGURE_SIGNATURES = {".png": b"\x89PNG\r\n\x1a\n"}
# A hardware class names a folder of the store and is part of a copied figure's name
# (`<stage>-<class>-<figure>`, with its temp file's prefix and suffix within 255 bytes).
MAX_CLASS_ID = 40
CLASS_ID = re.compile(rf"[a-z0-9][a-z0-9-]{{0,{MAX_CLASS_ID - 1}}}")
_STAGE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
STORE_LAYOUT = "<class>/<stage>.json and <class>/<stage>/<figure>.png"
RESULTS_LAYOUT = (
    "a results root holds run folders (<run id>/) and no *.json; a run folder holds "
    "<stage>.json and <stage>/"
)


def figure_signature(artifact: str) -> bytes | None:
    """The bytes a figure named ``artifact`` begins with, or None for an artifact that is no
    figure."""
    return next(
        (sig for suffix, sig in FIGURE_SIGNATURES.items() if artifact.endswith(suffix)), None
    )


def is_figure_name(name: str) -> bool:
    """Whether ``name`` is a name a record may give a figure: a plain artifact name with a
    figure type's suffix."""
    return is_artifact_name(name) and figure_signature(name) is not None


def listing(folder: Path) -> list[Path]:
    """The entries of ``folder``, sorted; a folder that cannot be listed is one line."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        msg = f"cannot list {folder}: {exc.strerror or exc}"
        raise ResultsError(msg) from None


def _mode(path: Path) -> int:
    """The type and permission bits of ``path`` itself (a link is not followed)."""
    try:
        return path.lstat().st_mode
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror or exc}"
        raise ResultsError(msg) from None


def is_real_folder(path: Path) -> bool:
    return stat.S_ISDIR(_mode(path))


def is_real_file(path: Path) -> bool:
    return stat.S_ISREG(_mode(path))


def is_temp_file(path: Path) -> bool:
    """Whether ``path`` is one of adrkit's temp files: a regular file of adrkit's temp name."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX) and is_real_file(path)


def _stray(path: Path, where: str, layout: str) -> ResultsError:
    return ResultsError(f"{path} is not where {where} puts anything ({layout})")


def store_record_paths(store: Path) -> list[Path]:
    """The record files of the evidence store, its whole layout checked."""
    where = "the evidence store's layout"
    paths = []
    for class_dir in listing(store):
        if is_temp_file(class_dir):
            continue
        if not (is_real_folder(class_dir) and CLASS_ID.fullmatch(class_dir.name)):
            raise _stray(class_dir, where, STORE_LAYOUT)
        entries = listing(class_dir)
        records = {p.name.removesuffix(RECORD_SUFFIX) for p in entries if is_real_file(p)}
        for entry in entries:
            stage = entry.name.removesuffix(RECORD_SUFFIX)
            if is_temp_file(entry):
                continue
            if entry.name.endswith(RECORD_SUFFIX) and _STAGE.fullmatch(stage):
                if not is_real_file(entry):
                    msg = (
                        f"stored record {entry} is not a regular file (a link, a folder or a FIFO)"
                    )
                    raise ResultsError(msg)
                paths.append(entry)
            elif is_real_folder(entry) and entry.name in records:
                for figure in listing(entry):
                    if not (is_temp_file(figure) or _is_figure_file(figure)):
                        raise _stray(figure, where, STORE_LAYOUT)
            else:
                raise _stray(entry, where, STORE_LAYOUT)
    return paths


def _is_figure_file(path: Path) -> bool:
    return is_figure_name(path.name) and is_real_file(path)


def results_record_paths(source: Path) -> list[Path]:
    """The record files of a results root or of one run folder (see the module's layout)."""
    entries = listing(source)
    if any(entry.name.endswith(RECORD_SUFFIX) for entry in entries):
        return _run_records(source, entries)
    paths = []
    for entry in entries:
        mode = _mode(entry)
        if stat.S_ISLNK(mode):  # a run's figures would be copied from wherever it leads
            raise _stray(entry, "a results root's layout (a link)", RESULTS_LAYOUT)
        if stat.S_ISDIR(mode):
            if not _RUN_ID.fullmatch(entry.name):
                raise _stray(entry, "a results root's layout (not a run id)", RESULTS_LAYOUT)
            paths += _run_records(entry, listing(entry))
    return paths


def _run_records(run_dir: Path, entries: list[Path]) -> list[Path]:
    """The records of RUN_DIR. Its folders are artifacts, but one that holds a record naming it
    as its run is a run folder: RUN_DIR is then a results root with a stray record in it, which
    must not hide the runs. (A stage's folder holds JSON of its own, a benchmark's results, say,
    and, while its stage runs, no record beside it yet: no record of it names it as a run.)"""
    records = [entry for entry in entries if entry.name.endswith(RECORD_SUFFIX)]
    stages = {entry.name.removesuffix(RECORD_SUFFIX) for entry in records}
    for entry in records:
        if not is_real_file(entry):
            msg = f"results record {entry} is not a regular file (a link, a folder or a FIFO)"
            raise ResultsError(msg)
    for entry in entries:
        if entry.name in stages or not is_real_folder(entry):
            continue
        if any(_names_its_run(inner) for inner in listing(entry) if inner.suffix == RECORD_SUFFIX):
            strays = ", ".join(str(r) for r in records)
            msg = (
                f"{run_dir} holds records ({strays}) beside {entry}, a run folder of its own: a "
                f"stray record in a results root ({RESULTS_LAYOUT})"
            )
            raise ResultsError(msg)
    return records


def _names_its_run(path: Path) -> bool:
    """Whether ``path`` is a record whose run is the folder it lies in."""
    if not is_real_file(path):
        return False
    try:
        record = read_record(path)
    except ResultsError:  # a benchmark's own JSON, or anything else that is no record
        return False
    return record.provenance.run_id == path.parent.name
