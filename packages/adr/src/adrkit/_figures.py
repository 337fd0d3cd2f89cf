"""The figures a block embeds: where a record's PNG artifact is copied beside the ADRs (one name
per stage, hardware class and figure) and the bytes a file of each figure type must begin with,
so that the writer copies only a file whose content is of the type its name says.
"""

from __future__ import annotations

from adrkit._evidence import hardware_class
from adrkit._record import Record

ASSETS_DIR = "assets"
# The figure types a block embeds, by the name's suffix, and the bytes such a file begins with:
# a figure is copied beside the ADRs only if its content is of the type its name says.
FIGURE_SIGNATURES = {".png": b"\x89PNG\r\n\x1a\n"}


def asset_name(record: Record, artifact: str) -> str:
    """Where a record's figure is copied beside the ADRs, relative to the ADR directory: one
    name per stage, hardware class and figure, since each class's newest record is shown."""
    return f"{ASSETS_DIR}/{record.stage}-{hardware_class(record)}-{artifact}"


def figure_signature(artifact: str) -> bytes | None:
    """The bytes a figure named ``artifact`` begins with, or None for an artifact that is no
    figure."""
    return next(
        (sig for suffix, sig in FIGURE_SIGNATURES.items() if artifact.endswith(suffix)), None
    )
