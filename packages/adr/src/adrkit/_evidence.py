"""Evidence: the newest record of every stage on every hardware class.

A record names the machine that produced it (`Provenance.hardware`). Its accelerator decides the
record's hardware class: the architecture for an AMD GPU (`gfx90a`), the device's name for any
other (`nvidia-h200`), and `cpu` for a machine without one. The ADRs show, for each block, the
newest record of each class, so a CPU night never hides what a GPU node measured.

The evidence store, ``<adr dir>/evidence/``, keeps those records in the repository, so they
survive a fresh clone: one directory per class, laid out like a run of a results root
(``<class>/<stage>.json``, and the figures the record embeds under ``<class>/<stage>/``), so a
stored record is read like any other. `store_evidence` fills it from a results directory; a stored
record is replaced only by a newer record of the same stage and class, and a skipped stage, which
measured nothing, never replaces one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from adrkit._errors import ResultsError
from adrkit._record import RECORD_SUFFIX, Record, read_record

EVIDENCE_DIR = "evidence"
CPU_CLASS = "cpu"


def hardware_class(record: Record) -> str:
    """The record's hardware class: ``gfx90a``-style for AMD GPUs, the slugged device name for
    other GPUs, ``cpu`` without one."""
    hardware = record.provenance.hardware
    arch, name = hardware.get("accelerator_arch"), hardware.get("accelerator")
    if isinstance(arch, str) and re.fullmatch(r"gfx[0-9a-f]+", arch):
        return arch
    if isinstance(name, str) and name.strip():
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or CPU_CLASS
    return CPU_CLASS


@dataclass(frozen=True)
class Evidence:
    """Stage -> hardware class -> the newest record of that stage on that class."""

    records: Mapping[str, Mapping[str, Record]]

    def latest(self, stage: str) -> Record | None:
        """The stage's newest record on any class."""
        found = self.by_class(stage)
        return found[0][1] if found else None

    def by_class(self, stage: str) -> list[tuple[str, Record]]:
        """(class, record) for every class that ran the stage, newest first."""
        records = self.records.get(stage, {})
        return sorted(records.items(), key=lambda item: item[1].provenance.ended_at, reverse=True)

    def stages(self) -> list[str]:
        return sorted(self.records)

    def latest_by_stage(self) -> dict[str, Record]:
        """Each stage's newest record on any class."""
        return {stage: record for stage in self.records if (record := self.latest(stage))}

    def __bool__(self) -> bool:
        return any(self.records.values())


def _record_paths(source: Path) -> list[Path]:
    """The record files of a run directory (records directly inside) or of a root of runs."""
    return sorted(source.glob(f"*{RECORD_SUFFIX}")) or sorted(source.glob(f"*/*{RECORD_SUFFIX}"))


def collect(records: Iterable[Record]) -> Evidence:
    """The newest record of each (stage, class) among ``records``."""
    newest: dict[str, dict[str, Record]] = {}
    for record in records:
        per_class = newest.setdefault(record.stage, {})
        key = hardware_class(record)
        known = per_class.get(key)
        if known is None or record.provenance.ended_at > known.provenance.ended_at:
            per_class[key] = record
    return Evidence(newest)


def load_evidence(sources: Sequence[Path]) -> Evidence:
    """The evidence of every source that exists: results roots, run directories, evidence stores.

    A source that is not a directory is skipped; if no source holds a record, that is an error
    naming them all, so a mistyped results path is never read as "nothing measured".
    """
    found: list[Record] = []
    for source in sources:
        if source.is_dir():
            found += [read_record(path) for path in _record_paths(source)]
        elif source.exists():
            msg = f"results directory {source} exists but is not a directory"
            raise ResultsError(msg)
    if not found:
        names = ", ".join(str(source) for source in sources)
        msg = f"no results records (*{RECORD_SUFFIX}) in {names}"
        raise ResultsError(msg)
    return collect(found)


def evidence_dir(adr_dir: Path) -> Path:
    return adr_dir / EVIDENCE_DIR


def stored_record(record: Record, figures: Mapping[str, str]) -> Record:
    """The record as the store keeps it: its figures at ``<stage>/<name>`` beside it, its other
    artifacts (full reports, patches) left in the results directory they came from."""
    return dataclasses.replace(
        record, artifacts={name: f"{record.stage}/{name}" for name in sorted(figures)}
    )


def record_json(record: Record) -> str:
    """A record file's text, as `write_record` writes it."""
    return json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n"
