"""Records on disk: one JSON file per stage under ``<results root>/<run id>/<stage>.json``.

The record's schema (its types, their checks and the gate comparison) is `adrkit.schema`'s; this
module writes and reads the files. The writer reads nothing but records, so a record carries
everything a block needs: the figures, the verdicts of its gates, where its artifacts lie, and where
the figures came from (provenance). Reading a record builds it through the schema's constructors, so
every field is checked again, a gate's stored verdict included.

Artifacts live in the record's run directory, and a record names them by paths relative to it, so a
run's folder can be moved (into an evidence store, onto another machine) with its records. Before
this rule a record named them by absolute paths, which still read; a relative path never had a
defined base (it meant the current directory of whoever read it), so defining it as the run
directory changes no record written by the pipeline and the version stays.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from adrkit._errors import ResultsError
from adrkit._files import FileReadError, atomic_write, read_capped
from adrkit.schema import Record, RecordError

RECORD_SUFFIX = ".json"
# The largest record, an audit in which every file of a vLLM tree differs from its fork, is about
# 1.2 MiB as written (a record of 3,500 such files in its `changes` and `findings` tables). A
# file of 16 MiB is no record, and is refused before it is loaded.
MAX_RECORD_BYTES = 16 * 2**20


def artifact_in_run_dir(run_dir: Path, path: Path) -> Path | None:
    """``path`` relative to ``run_dir``, both resolved (links followed), or None when it lies
    outside the run directory or cannot be resolved (a loop of links)."""
    try:
        return path.resolve().relative_to(run_dir.resolve())
    except (OSError, RuntimeError, ValueError):
        return None


def write_record(results_root: Path, record: Record) -> Path:
    """Write ``record`` to ``<results_root>/<run id>/<stage>.json`` atomically; return the path.

    Each artifact must lie in the run directory (``record.artifacts`` are paths as this process
    sees them, absolute or relative to the current directory); the file names it by its path
    relative to the run directory, so the run's folder can be moved with its records.
    """
    run_dir = results_root / record.provenance.run_id
    artifacts = {}
    for name, source in record.artifacts.items():
        inside = artifact_in_run_dir(run_dir, Path(source))
        if inside is None:
            msg = (
                f"artifact {name!r} of stage {record.stage!r} is {source}, outside the run "
                f"directory {run_dir}; a record's artifacts live in its run directory"
            )
            raise RecordError(msg)
        artifacts[name] = inside.as_posix()
    data = record.to_dict() | {"artifacts": artifacts}
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{record.stage}{RECORD_SUFFIX}"
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return path


def read_record(path: Path) -> Record:
    """Read one record file; a corrupt, foreign or oversized file is a one-line `ResultsError`.

    The record's artifacts come back as paths this process can open: a relative path in the file
    is taken relative to the record's directory, never to the current one.
    """
    try:
        data = json.loads(read_capped(path, MAX_RECORD_BYTES).decode("utf-8"))
    except FileReadError as exc:
        msg = f"cannot read results record {path}: {exc}"
        raise ResultsError(msg) from None
    except RecursionError:
        msg = f"cannot read results record {path}: its JSON is nested too deeply"
        raise ResultsError(msg) from None
    except ValueError as exc:  # not UTF-8, not JSON, or an integer of too many digits
        msg = f"cannot read results record {path}: {exc}"
        raise ResultsError(msg) from None
    if not isinstance(data, dict):
        msg = f"results record {path} is not a JSON object"
        raise ResultsError(msg)
    try:
        record = Record.from_dict(data)
    except RecordError as exc:
        msg = f"results record {path} is invalid: {exc}"
        raise ResultsError(msg) from None
    run_dir = path.parent.absolute()
    artifacts = {name: str(run_dir / source) for name, source in record.artifacts.items()}
    return dataclasses.replace(record, artifacts=artifacts)


@dataclass(frozen=True)
class RecordFile:
    """A record and the file it was read from, whose directory is the record's run directory."""

    path: Path
    record: Record

    @property
    def run_dir(self) -> Path:
        return self.path.parent


def latest_records(results: Path) -> dict[str, RecordFile]:
    """The newest record of every stage found under ``results``, with its file.

    ``results`` is either one run's directory (records directly inside) or a results root holding
    run directories. From a root, each stage takes its newest record by end time, so a milestone
    run of one stage does not blank the blocks that other stages filled the night before.
    """
    if not results.is_dir():
        problem = "exists but is not a directory" if results.exists() else "does not exist"
        msg = f"results directory {results} {problem}"
        raise ResultsError(msg)
    paths = sorted(results.glob(f"*{RECORD_SUFFIX}")) or sorted(results.glob(f"*/*{RECORD_SUFFIX}"))
    latest: dict[str, RecordFile] = {}
    for path in paths:
        record = read_record(path)
        known = latest.get(record.stage)
        if known is None or record.provenance.ended > known.record.provenance.ended:
            latest[record.stage] = RecordFile(path, record)
    if not latest:
        msg = f"results directory {results} holds no records (*{RECORD_SUFFIX})"
        raise ResultsError(msg)
    return latest


def load_latest(results: Path) -> dict[str, Record]:
    """Return the newest record of every stage found under ``results`` (see `latest_records`)."""
    return {stage: found.record for stage, found in latest_records(results).items()}
