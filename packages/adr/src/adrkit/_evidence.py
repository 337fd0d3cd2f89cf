"""Evidence: the newest record of every stage on every hardware class.

A record names the machine that produced it (`Provenance.hardware`). Its accelerator decides the
record's hardware class: the architecture for an AMD GPU (``gfx90a``), the device's name for any
other (``nvidia-h200``), and ``cpu`` for a machine without one. The ADRs show, for each stage that
runs on several classes, the newest record of each class, so a CPU night never hides what a GPU
node measured.

The evidence store, ``<adr dir>/evidence/``, keeps those records in the repository, so they
survive a fresh clone: one folder per class, laid out like a run of a results root
(``<class>/<stage>.json``, and the figures the record embeds under ``<class>/<stage>/``), so a
stored record is read like any other. The ADR writer fills it from a results directory when asked
(`update_adrs(store=...)`); a stored record is replaced only by a newer record of the same stage
and class, and a skipped stage, which measured nothing, never replaces one. A figure in a stored
record's folder that the record does not name (an older record's) is removed by the update that
finds it (`adrkit._figures`). Nothing else writes there.

``<adr dir>/hardware.toml`` names the classes the team expects and the stages each should run, so
a class that never ran a stage says so instead of being silently absent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adrkit._errors import AdrError, ResultsError
from adrkit._files import is_language_table, read_declarations
from adrkit._layout import (
    CLASS_ID,
    MAX_CLASS_ID,
    STORE_LAYOUT,
    results_record_paths,
    store_record_paths,
)
from adrkit._record import RECORD_SUFFIX, RecordFile, read_record
from adrkit.schema import Record

EVIDENCE_DIR = "evidence"
HARDWARE_FILE = "hardware.toml"
CPU_CLASS = "cpu"
# How far past this machine's clock a record may end: clocks of the nodes that wrote the records
# differ. A record that ends later (in year 9999, say) would stay the newest for good.
CLOCK_SKEW = timedelta(days=1)
# A hardware file lists a handful of classes; a large one was not written for adrkit.
_MAX_HARDWARE_BYTES = 64 * 2**10


def hardware_class(record: Record) -> str:
    """The record's hardware class: ``gfx90a``-style for AMD GPUs, the slugged device name for
    other GPUs, ``cpu`` without one."""
    hardware = record.provenance.hardware
    arch, name = hardware.get("accelerator_arch"), hardware.get("accelerator")
    if isinstance(arch, str) and re.fullmatch(r"gfx[0-9a-f]+", arch):
        return arch
    if isinstance(name, str):
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        if len(slug) > MAX_CLASS_ID:  # a folder's and a file name's part: cut, kept unique
            digest = hashlib.sha256(slug.encode()).hexdigest()[:8]
            slug = f"{slug[: MAX_CLASS_ID - 9].rstrip('-')}-{digest}"
        if slug:
            return slug
    return CPU_CLASS


@dataclass(frozen=True)
class HardwareClass:
    """A class the ADRs report: its id, its name in each language, the stages it should run."""

    id: str
    label: dict[str, str]
    stages: tuple[str, ...]


@dataclass(frozen=True)
class HardwareClasses:
    """The classes of ``hardware.toml``, in its order; empty when the file is absent."""

    classes: tuple[HardwareClass, ...] = ()

    @property
    def per_hardware_stages(self) -> frozenset[str]:
        """Stages whose blocks show one section per class."""
        return frozenset(stage for c in self.classes for stage in c.stages)

    def expected(self, stage: str) -> list[HardwareClass]:
        return [c for c in self.classes if stage in c.stages]

    def label(self, class_id: str, lang: str, record: Record | None = None) -> str:
        """The class's name: from the file, else the record's accelerator, else its id."""
        for known in self.classes:
            if known.id == class_id:
                return known.label.get(lang) or known.label.get("en") or class_id
        name = record.provenance.hardware.get("accelerator") if record is not None else None
        return name if isinstance(name, str) and name else class_id


def load_hardware(adr_dir: Path) -> HardwareClasses:
    """``<adr dir>/hardware.toml``, checked whole; no file means no expected classes."""
    path = adr_dir / HARDWARE_FILE
    data = read_declarations(path, _MAX_HARDWARE_BYTES)
    if data is None:
        return HardwareClasses()
    classes = []
    for class_id, entry in data.items():
        where = f"{path}: [{class_id}]"
        if not CLASS_ID.fullmatch(class_id):
            msg = (
                f"{where} is not a class id (lowercase letters, digits and '-', at most "
                f"{MAX_CLASS_ID})"
            )
            raise AdrError(msg)
        if not isinstance(entry, dict) or set(entry) != {"label", "stages"}:
            msg = f"{where} must be a table with exactly `label` and `stages`"
            raise AdrError(msg)
        label, stages = entry["label"], entry["stages"]
        if not is_language_table(label):
            msg = f'{where} `label` must be a table of language = name, e.g. {{ en = "..." }}'
            raise AdrError(msg)
        if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
            msg = f"{where} `stages` must be a list of stage names"
            raise AdrError(msg)
        classes.append(HardwareClass(class_id, dict(label), tuple(stages)))
    return HardwareClasses(tuple(classes))


@dataclass(frozen=True)
class Evidence:
    """Stage -> hardware class -> the newest record of that stage on that class, with its file."""

    files: dict[str, dict[str, RecordFile]] = field(default_factory=dict)

    def by_class(self, stage: str) -> list[tuple[str, RecordFile]]:
        """(class, record file) for every class that ran the stage, newest first."""
        per_class = self.files.get(stage, {})
        return sorted(
            per_class.items(), key=lambda item: item[1].record.provenance.ended, reverse=True
        )

    def latest(self, stage: str) -> RecordFile | None:
        """The stage's newest record on any class."""
        found = self.by_class(stage)
        return found[0][1] if found else None

    def latest_by_stage(self) -> dict[str, RecordFile]:
        """Each stage's newest record on any class."""
        return {stage: found for stage in sorted(self.files) if (found := self.latest(stage))}

    def all_files(self) -> list[RecordFile]:
        return [found for per_class in self.files.values() for found in per_class.values()]

    def __bool__(self) -> bool:
        return any(self.files.values())

    @classmethod
    def of(cls, records: Iterable[Record]) -> Evidence:
        """The evidence of records held in memory, for rendering: each as if read from
        ``<stage>.json`` in the current directory (only figures are read from a record's
        folder, and rendering reads none)."""
        return collect(RecordFile(Path(f"{r.stage}{RECORD_SUFFIX}"), r) for r in records)


def collect(files: Iterable[RecordFile]) -> Evidence:
    """The newest record of each (stage, class) among ``files``."""
    newest: dict[str, dict[str, RecordFile]] = {}
    for found in files:
        per_class = newest.setdefault(found.record.stage, {})
        key = hardware_class(found.record)
        known = per_class.get(key)
        if known is None or found.record.provenance.ended > known.record.provenance.ended:
            per_class[key] = found
    return Evidence(newest)


def read_source(source: Path) -> list[RecordFile]:
    """Every record of a results root or a run folder (`adrkit._layout`); none if the folder
    does not exist."""
    if not source.exists():
        return []
    if not source.is_dir():
        msg = f"results directory {source} exists but is not a directory"
        raise ResultsError(msg)
    return [_read(path) for path in results_record_paths(source)]


def read_store(adr_dir: Path) -> list[RecordFile]:
    """Every record of the evidence store, each in the folder of its hardware class."""
    store = evidence_dir(adr_dir)
    if not store.exists():
        return []
    if store.is_symlink() or not store.is_dir():
        msg = f"{store} must be a directory in {adr_dir}, not a link or a file"
        raise ResultsError(msg)
    found = [_read(path) for path in store_record_paths(store)]
    for record_file in found:
        class_id = hardware_class(record_file.record)
        if record_file.path.parent.name != class_id:
            msg = (
                f"stored record {record_file.path} is of hardware class {class_id!r}, not of the "
                f"folder it lies in ({STORE_LAYOUT})"
            )
            raise ResultsError(msg)
    return found


def _read(path: Path) -> RecordFile:
    """The record at ``path``, which must be named for its stage and must not end in the
    future."""
    record = read_record(path)
    if path.name != f"{record.stage}{RECORD_SUFFIX}":
        msg = f"results record {path} is of stage {record.stage!r}; a record is <stage>.json"
        raise ResultsError(msg)
    latest = datetime.now(UTC) + CLOCK_SKEW
    if record.provenance.ended > latest:
        msg = (
            f"results record {path} ends at {record.provenance.ended_at}, after this machine's "
            f"clock (more than {CLOCK_SKEW.days} day ahead): it would stay the newest for good"
        )
        raise ResultsError(msg)
    return RecordFile(path, record)


def load_evidence(sources: Sequence[Path]) -> Evidence:
    """The evidence of every source; an error naming them all when none holds a record, so a
    mistyped results path is never read as "nothing measured"."""
    evidence = collect(found for source in sources for found in read_source(source))
    if not evidence:
        names = ", ".join(str(source) for source in sources)
        msg = f"no results records (*{RECORD_SUFFIX}) in {names}"
        raise ResultsError(msg)
    return evidence


def evidence_dir(adr_dir: Path) -> Path:
    return adr_dir / EVIDENCE_DIR


def stored_path(adr_dir: Path, record: Record) -> Path:
    """Where the store keeps ``record``: ``evidence/<class>/<stage>.json``."""
    return evidence_dir(adr_dir) / hardware_class(record) / f"{record.stage}{RECORD_SUFFIX}"


def to_store(adr_dir: Path, incoming: Sequence[RecordFile]) -> list[RecordFile]:
    """The records of ``incoming`` that belong in the store: the newest of each (stage, class),
    not skipped, and newer than what the store holds for it."""
    stored = collect(read_store(adr_dir))
    wanted = collect(found for found in incoming if found.record.status != "skipped")
    chosen = []
    for stage, per_class in wanted.files.items():
        for class_id, found in per_class.items():
            held = stored.files.get(stage, {}).get(class_id)
            if held is None or found.record.provenance.ended > held.record.provenance.ended:
                chosen.append(found)
    return chosen
