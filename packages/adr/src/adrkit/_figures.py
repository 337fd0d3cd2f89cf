"""The figures a block embeds: where a record's PNG artifact is copied beside the ADRs (one name
per stage, hardware class and figure), the bytes a file of each figure type must begin with, so
that the writer copies only a file whose content is of the type its name says, and which copies
an update removes because no record it shows or stores names them any more.

A figure adrkit wrote and no record names is stale: a newer record of the same stage and class
dropped it, and beside current evidence it would pass for a figure of it. An update removes only
what it can tell it wrote by the name: a regular file (no link) in ``assets/`` named
`asset_name` for a stage and class the update shows and a figure name, or one in a stored
record's folder (``evidence/<class>/<stage>/``) with a figure name. Any other file there is
someone else's and stays.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from adrkit._evidence import Evidence, hardware_class, stored_path
from adrkit._layout import figure_signature, is_figure_name
from adrkit._record import RecordFile
from adrkit.schema import Record

ASSETS_DIR = "assets"


def asset_name(record: Record, artifact: str) -> str:
    """Where a record's figure is copied beside the ADRs, relative to the ADR directory: one
    name per stage, hardware class and figure, since each class's newest record is shown."""
    return f"{ASSETS_DIR}/{record.stage}-{hardware_class(record)}-{artifact}"


def stale_assets(adr_dir: Path, evidence: Evidence, known_classes: Iterable[str]) -> list[Path]:
    """The copies in ``assets/`` of figures that none of the records ``evidence`` shows embeds,
    among the names `asset_name` gives a stage and class it shows. A figure whose source file
    is gone is still embedded (its copy stays), so what is shown is read from the records'
    artifact names, not from the figures copied.

    A name can read as more than one stage and class (`throughput-nvidia-h200-nvl-x.png` is
    class `nvidia-h200`'s `nvl-x.png` and `nvidia-h200-nvl`'s `x.png`); a copy that could be a
    figure of a class in ``known_classes`` (the hardware file's, the store's) that the evidence
    does not show for that stage is not adrkit's to judge, and stays."""
    assets = adr_dir / ASSETS_DIR
    if not _real_folder(adr_dir, assets):
        return []
    shown = {
        adr_dir / asset_name(found.record, name)
        for found in evidence.all_files()
        for name in found.record.artifacts
        if figure_signature(name) is not None
    }
    pairs = {
        (stage, class_id) for stage, per_class in evidence.files.items() for class_id in per_class
    }
    classes = {*known_classes, *(class_id for _stage, class_id in pairs)}

    def owners(name: str) -> set[tuple[str, str]]:
        return {
            (stage, class_id)
            for stage in evidence.files
            for class_id in classes
            if name.startswith(prefix := f"{stage}-{class_id}-")
            and is_figure_name(name.removeprefix(prefix))
        }

    return [
        path
        for path in sorted(assets.iterdir())
        if path not in shown
        and (found := owners(path.name))
        and found <= pairs
        and _regular_file(path)
    ]


def stale_stored_figures(adr_dir: Path, held: Iterable[RecordFile]) -> list[Path]:
    """The files of stored records' folders (``evidence/<class>/<stage>/``) with a figure's name
    that the record there does not name, for ``held``, the records the store holds once the
    update is done. A record outside the place `stored_path` gives it was not put there by
    adrkit, and its folder is left alone."""
    stale = []
    for found in held:
        if found.path != stored_path(adr_dir, found.record):
            continue
        folder = found.run_dir / found.record.stage
        if not _real_folder(adr_dir, folder):
            continue
        # A record read from its file names its artifacts by absolute paths, one still to be
        # written by paths relative to its folder.
        named = {_absolute(found.run_dir / source) for source in found.record.artifacts.values()}
        stale += [
            path
            for path in sorted(folder.iterdir())
            if _absolute(path) not in named and is_figure_name(path.name) and _regular_file(path)
        ]
    return stale


def _real_folder(adr_dir: Path, folder: Path) -> bool:
    """Whether ``folder`` is a directory that no link on its way from ``adr_dir`` leads to: a
    removal through a link would remove a file outside the ADR directory."""
    relative = folder.relative_to(adr_dir)
    on_the_way = [adr_dir / part for part in [*reversed(relative.parents), relative]][1:]
    return folder.is_dir() and not any(part.is_symlink() for part in on_the_way)


def _absolute(path: Path) -> Path:
    return Path(os.path.normpath(path.absolute()))


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False
