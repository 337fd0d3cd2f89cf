"""The results record's schema: the record, its tables, gates, provenance and artifact names,
and the one gate comparison (`holds`).

Every package builds its part of a record from these types: kvquant's build and correctness
check and kvbench's benchmarks give a `RecordParts`, forkaudit too; the pipeline's flows add the
provenance and make the `Record`; adrkit writes, reads and renders records. Nothing here imports
anything but the standard library, so a GPU node that installs kvquant carries no ADR writer.

A record is plain JSON. The schema is versioned by ``schema_version``: a reader accepts only
versions it knows; adding an optional field keeps the version, changing the meaning of one bumps
it. Every constructor checks its fields, so a record read back is checked as one being built:
a gate's verdict is judged again from its value, op and threshold, and a stored `passed` that
disagrees is refused (the guard against a forged verdict).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

SCHEMA_VERSION = 1
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
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}
# The comparisons a gate may use, in the order error messages list them.
COMPARISONS = tuple(_COMPARISONS)


class RecordError(ValueError):
    """Raised when a record, or a part of one, does not fit the schema."""


def holds(value: float, op: str, threshold: float) -> bool:
    """``value op threshold``: the one gate comparison. A value or threshold that is not finite
    never holds: NaN compares false anyway, and an infinite one would pass a `>=` or `<=` it
    cannot have met. An unknown ``op`` is a `RecordError`."""
    compare = _COMPARISONS.get(op)
    if compare is None:
        msg = f"op {op!r} is not one of {', '.join(COMPARISONS)}"
        raise RecordError(msg)
    return math.isfinite(value) and math.isfinite(threshold) and compare(value, threshold)


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
        for number in ("value", "threshold"):
            try:
                # A JSON integer too large for a float would crash every later comparison.
                object.__setattr__(self, number, float(getattr(self, number)))
            except OverflowError:
                msg = f"gate `{self.name}`: `{number}` is an integer too large for a number"
                raise RecordError(msg) from None
        try:
            judged = holds(self.value, self.op, self.threshold)
        except RecordError as error:
            raise RecordError(f"gate `{self.name}`: {error}") from None
        if self.passed is not judged:
            msg = (
                f"gate `{self.name}`: stored verdict `passed: {json.dumps(self.passed)}` "
                f"disagrees with {self.value:g} {self.op} {self.threshold:g}, which "
                f"{'passes' if judged else 'fails'}"
            )
            raise RecordError(msg)

    @classmethod
    def judge(cls, name: str, value: float, op: str, threshold: float) -> Gate:
        """Judge ``value op threshold`` (`holds`)."""
        try:
            passed = holds(value, op, threshold)
        except RecordError as error:
            raise RecordError(f"gate `{name}`: {error}") from None
        return cls(name=name, value=value, op=op, threshold=threshold, passed=passed)


def gate_rule(name: str, rule: object) -> tuple[str, float]:
    """A declared gate ``{ op = ..., threshold = ... }`` (flows' gates.toml, the ADRs'
    decisions.toml) checked: its comparison and finite threshold.

    Raises:
        RecordError: naming what is wrong; the caller adds where the rule is declared.
    """
    if not isinstance(rule, dict) or set(rule) != {"op", "threshold"}:
        raise RecordError("must be a table { op = ..., threshold = ... }")
    op, threshold = str(rule["op"]), rule["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise RecordError(f"threshold {threshold!r} is not a number")
    if not math.isfinite(threshold):
        raise RecordError(f"threshold {threshold!r} is not finite")
    holds(0.0, op, float(threshold))  # an unknown comparison is refused
    return op, float(threshold)


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
            msg = f"`schema_version` is {version!r}; this reader reads version {SCHEMA_VERSION}"
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


@dataclass(frozen=True)
class RecordParts:
    """What a package's result gives its stage's record: the summary line, the metrics, the
    tables, the verdicts of its own gates and the files it wrote (name -> path). The pipeline
    adds the provenance, its own gates and the status (`flows._stage.stage_record`)."""

    summary: str
    metrics: dict[str, Scalar]
    tables: dict[str, Table]
    gates: list[Gate] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)


def files_by_name(*paths: str | None) -> dict[str, str]:
    """A record's artifacts: each file (None: not written) under its file name."""
    return {Path(path).name: path for path in paths if path is not None}
