"""The results record: what one pipeline stage hands to the ADR writer.

A record is plain JSON, one file per stage under ``<results root>/<run id>/<stage>.json``. The
writer reads nothing else, so a record carries everything a block needs: the figures, the verdicts
of its gates, where its artifacts lie, and where the figures came from (provenance).

The schema is versioned by ``schema_version``. A reader accepts only versions it knows; adding an
optional field keeps the version, changing the meaning of one bumps it.

Artifacts live in the record's run directory, and a record names them by paths relative to it, so
a run's folder can be moved (into an evidence store, onto another machine) with its records.
Before this rule a record named them by absolute paths, which still read; a relative path never
had a defined base (it meant the current directory of whoever read it), so defining it as the
run directory changes no record written by the pipeline and the version stays.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from adrkit._errors import RecordError, ResultsError
from adrkit._files import FileReadError, atomic_write, read_capped

SCHEMA_VERSION = 1
RECORD_SUFFIX = ".json"
# The largest record, an audit in which every file of a vLLM tree differs from its fork, is about
# 1.2 MiB as written (a record of 3,500 such files in its `changes` and `findings` tables). A
# file of 16 MiB is no record, and is refused before it is loaded.
MAX_RECORD_BYTES = 16 * 2**20

Status = Literal["passed", "failed", "skipped"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "skipped")

# A metric or table cell is a JSON scalar. Lists and objects belong in tables or artifacts.
Scalar = str | int | float | bool | None

# Stage and artifact names become parts of file names beside the ADRs (a figure is copied to
# `assets/<stage>-<artifact>`): plain names, never paths, short enough that the copy's name and
# its temp file's stay within the 255 bytes a file name may have.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Provenance fields are shown in code spans, where Markdown shows every character literally, so
# they cannot be escaped: they are held to their formats instead. A run id is also the name of
# the run's directory.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_GIT_HASH = re.compile(r"[0-9a-f]{7,64}")
# UTC, as `utc_now` writes it; the fraction may be shorter or absent in records of other writers.
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z")
# A source file's path, relative and plain (shown in code spans), and its digest.
_SOURCE_PATH = re.compile(r"(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9._/-]{1,255}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ID_CHARS = "letters, digits, '.', '_' or '-' (128 at most, the first a letter or digit)"
_TIME = "a UTC time like 2026-11-29T02:00:00.000000Z"
_HASH = "a git hash in lowercase hex"
# Field: (format, what it is in words, whether it may be null).
_PROVENANCE_FORMATS: dict[str, tuple[re.Pattern[str], str, bool]] = {
    "run_id": (_RUN_ID, _ID_CHARS, False),
    "started_at": (_TIMESTAMP, _TIME, False),
    "ended_at": (_TIMESTAMP, _TIME, False),
    "repo_commit": (_GIT_HASH, _HASH, True),
    "fork_commit": (_GIT_HASH, _HASH, True),
    "fork_tree": (_GIT_HASH, _HASH, True),
    "flow_run_id": (_RUN_ID, _ID_CHARS, True),
}
_GATE_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    ">=": lambda v, t: v >= t,
    ">": lambda v, t: v > t,
    "==": lambda v, t: v == t,
}


def _verdict(value: float, op: str, threshold: float) -> bool:
    """``value op threshold``, where a value or threshold that is not finite never passes: NaN
    compares false anyway, and an infinite one would pass a `>=` or `<=` gate it cannot have met."""
    return math.isfinite(value) and math.isfinite(threshold) and _GATE_OPS[op](value, threshold)


@dataclass(frozen=True)
class Gate:
    """A pass/fail verdict on one metric, kept with the threshold it was judged against.

    The verdict is judged again whenever a gate is built, a read one included: a stored `passed`
    that disagrees with its value, op and threshold is refused, never shown.
    """

    name: str
    value: float
    op: str
    threshold: float
    passed: bool

    def __post_init__(self) -> None:
        _check_op(self.name, self.op)
        for number in ("value", "threshold"):
            try:
                # A JSON integer too large for a float would crash every later comparison.
                object.__setattr__(self, number, float(getattr(self, number)))
            except OverflowError:
                msg = f"gate `{self.name}`: `{number}` is an integer too large for a number"
                raise RecordError(msg) from None
        judged = _verdict(self.value, self.op, self.threshold)
        if self.passed is not judged:
            msg = (
                f"gate `{self.name}`: stored verdict `passed: {json.dumps(self.passed)}` "
                f"disagrees with {self.value:g} {self.op} {self.threshold:g}, which "
                f"{'passes' if judged else 'fails'}"
            )
            raise RecordError(msg)

    @classmethod
    def judge(cls, name: str, value: float, op: str, threshold: float) -> Gate:
        """Judge ``value op threshold``; a value or threshold that is not finite never passes."""
        _check_op(name, op)
        passed = _verdict(value, op, threshold)
        return cls(name=name, value=value, op=op, threshold=threshold, passed=passed)


def _check_op(name: str, op: str) -> None:
    if op not in _GATE_OPS:
        msg = f"gate `{name}`: op {op!r} is not one of {sorted(_GATE_OPS)}"
        raise RecordError(msg)


@dataclass(frozen=True)
class Table:
    """A small table of scalars; ``columns`` are stable ids that renderers translate.

    ``baseline_found`` is for a table of differences against an earlier result: False when there
    was none, so no rows means "nothing to compare against", not "nothing changed". None for a
    table that compares nothing, and in records written before the field existed.
    """

    columns: list[str]
    rows: list[list[Scalar]]
    baseline_found: bool | None = None

    def keyed_rows(self) -> list[dict[str, Scalar]]:
        """Each row as a mapping from column id to value, for a reader that names the columns
        it reads rather than counting them."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class Provenance:
    """Where a record's figures came from."""

    run_id: str
    started_at: str
    ended_at: str
    repo_commit: str | None = None
    repo_dirty: bool | None = None
    fork_commit: str | None = None
    fork_tree: str | None = None
    flow_run_id: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    hardware: dict[str, Scalar] = field(default_factory=dict)
    # The SHA-256 of each source file the stage's figures depend on, by its path relative to the
    # repository root, as it ran (`adrkit._freshness`); empty in records written before.
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path, digest in self.sources.items():
            if not (_SOURCE_PATH.fullmatch(path) and _SHA256.fullmatch(digest)):
                msg = (
                    f"`provenance.sources` maps a relative path to a SHA-256 in lowercase hex, "
                    f"got {path!r}: {digest!r}"
                )
                raise RecordError(msg)
        for name, (pattern, expected, nullable) in _PROVENANCE_FORMATS.items():
            value = getattr(self, name)
            if value is None and nullable:
                continue
            if not (isinstance(value, str) and pattern.fullmatch(value)):
                msg = (
                    f"`provenance.{name}` must be {expected}{', or null' * nullable}, got {value!r}"
                )
                raise RecordError(msg)
        for name in ("started_at", "ended_at"):
            try:
                datetime.fromisoformat(getattr(self, name))
            except ValueError:
                msg = f"`provenance.{name}` is not a valid date and time: {getattr(self, name)!r}"
                raise RecordError(msg) from None

    @property
    def ended(self) -> datetime:
        """`ended_at` as a time, which orders records whatever the digits of their fractions."""
        return datetime.fromisoformat(self.ended_at)


@dataclass(frozen=True)
class Record:
    """The result of one stage of one pipeline run."""

    stage: str
    status: Status
    provenance: Provenance
    summary: str = ""
    reason: str | None = None
    metrics: dict[str, Scalar] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    gates: list[Gate] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.stage):
            msg = f"`stage` must be lowercase letters, digits, '-' or '_', got {self.stage!r}"
            raise RecordError(msg)
        if self.status not in STATUSES:
            msg = f"`status` must be one of {', '.join(STATUSES)}, got {self.status!r}"
            raise RecordError(msg)
        if self.status != "passed" and not self.reason:
            msg = f"stage {self.stage!r} is {self.status} but has no `reason`"
            raise RecordError(msg)
        for name in self.artifacts:
            if not is_artifact_name(name):
                msg = f"artifact name {name!r} of stage {self.stage!r} must be a plain file name"
                raise RecordError(msg)
        for name, table in self.tables.items():
            width = len(table.columns)
            if any(len(row) != width for row in table.rows):
                msg = f"table `{name}` of stage {self.stage!r} has rows not {width} cells wide"
                raise RecordError(msg)

    @property
    def gates_passed(self) -> bool:
        return all(gate.passed for gate in self.gates)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Record:
        """Build a record from parsed JSON, naming the first field that is wrong."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            msg = f"`schema_version` is {version!r}; this adrkit reads version {SCHEMA_VERSION}"
            raise RecordError(msg)
        _check_fields(cls, data, "")
        try:
            provenance = Provenance(**_as_mapping(data.get("provenance"), "provenance"))
            tables = {
                name: Table(**_as_mapping(table, f"tables.{name}"))
                for name, table in _as_mapping(data.get("tables", {}), "tables").items()
            }
            gates = [Gate(**_as_mapping(g, "gates[]")) for g in _as_list(data.get("gates", []))]
            scalars = {k: v for k, v in data.items() if k not in _NESTED_FIELDS}
            return cls(provenance=provenance, tables=tables, gates=gates, **scalars)  # type: ignore[arg-type]
        except TypeError as exc:
            raise RecordError(str(exc).replace("__init__() ", "")) from None


_NESTED_FIELDS = frozenset({"provenance", "tables", "gates", "schema_version"})


def _as_mapping(value: object, name: str) -> dict[str, Any]:
    # Any: `_check_fields` has checked the values' types; the constructors check the names.
    if not isinstance(value, Mapping):
        msg = f"`{name}` must be an object, got {_json_type(value)}"
        raise RecordError(msg)
    return {str(k): v for k, v in value.items()}


def _as_list(value: object) -> list[object]:
    if not isinstance(value, list):
        msg = f"`gates` must be a list, got {_json_type(value)}"
        raise RecordError(msg)
    return value


# Checking every field's type when a record is read keeps a hand-edited or foreign record from
# crashing a renderer, or the newest-record comparison, long after the read.
_JSON_TYPES: dict[type, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _check_fields(cls: type, data: Mapping[str, object], prefix: str) -> None:
    """Check the type of every field of ``cls`` that ``data`` holds; a missing or unknown field is
    left to the constructor, which names it."""
    field_types = _field_types(cls)
    for name, value in data.items():
        if name in field_types:
            _check(value, field_types[name], prefix + name)


def _check(value: object, hint: Any, where: str) -> None:
    """Raise a `RecordError` naming ``where`` unless ``value``, parsed JSON, fits the type
    ``hint``, looking inside lists, objects and nested dataclasses."""
    if not _fits(value, hint):
        msg = f"`{where}` must be {_expected(hint)}, got {_json_type(value)}"
        raise RecordError(msg)
    origin = get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        _check_fields(hint, value, where + ".")
    elif origin is list and isinstance(value, list):
        (item_type,) = get_args(hint)
        for index, item in enumerate(value):
            _check(item, item_type, f"{where}[{index}]")
    elif origin is dict and isinstance(value, Mapping):
        _, item_type = get_args(hint)
        for key, item in value.items():
            _check(item, item_type, f"{where}.{key}")


def _fits(value: object, hint: Any) -> bool:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, option) for option in get_args(hint))
    if origin is Literal:
        # Only the type: the dataclass names the allowed values in its own, clearer message.
        return all(isinstance(value, type(allowed)) for allowed in get_args(hint))
    if origin is dict or dataclasses.is_dataclass(hint):
        return isinstance(value, Mapping)
    if origin is list:
        return isinstance(value, list)
    if isinstance(value, bool):  # a bool is an int to Python, but not to the schema
        return hint is bool
    if hint is float:  # a writer may drop the ".0" of a whole number
        return isinstance(value, int | float)
    return isinstance(value, hint)


def _expected(hint: Any) -> str:
    if hint == Scalar:
        return "a string, number, boolean or null"
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(option) for option in get_args(hint))
    if origin is Literal:
        return _JSON_TYPES[type(get_args(hint)[0])]
    if origin is dict or dataclasses.is_dataclass(hint):
        return "an object"
    return _JSON_TYPES[origin or hint]


def is_artifact_name(name: str) -> bool:
    """Whether ``name`` is a plain file name a record may give an artifact."""
    return _ARTIFACT_NAME.fullmatch(name) is not None


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
