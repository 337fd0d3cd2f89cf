"""The declarative rules file: nested titled groups that classify changed files by area.

The shape follows forkdiff: every group has a title, a Markdown `why`, globs and an `ignore`
list, and may hold `sub` groups. The deepest matching group of the first top-level group that
matches claims a file; a file no group claims lands in the generated "other" area, so new drift
always shows. Unknown keys are errors, not silent no-ops.
"""

import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from forkaudit._errors import RulesFileError

OTHER_AREA = "other"
STREAMS = ("A", "B", "C")
DEFAULT_RULES_NAME = "vllm.toml"
#: A rules file over this size is refused unread; the shipped one is about 6 KB.
MAX_RULES_BYTES = 1 << 20
#: Groups may nest this deep (the shipped rules use 2 levels); deeper is refused, not recursed.
MAX_GROUP_DEPTH = 16

_T = TypeVar("_T")

_TOP_KEYS = {"title", "upstream", "fork", "keywords", "ignore", "semantic", "history", "group"}
_GROUP_KEYS = {"title", "why", "area", "streams", "risk", "globs", "ignore", "sub"}
_SIDE_KEYS = {"source"}
_SEMANTIC_KEYS = {
    "envs_files",
    "env_dicts",
    "cache_dtype_names",
    "backend_enums",
    "kv_cache_dtype_attributes",
    "backend_areas",
}
_HISTORY_KEYS = {"files_per_topic"}


@dataclass(frozen=True)
class SemanticRules:
    """Which Python names the semantic diff reads (see `_semantic`)."""

    envs_files: tuple[str, ...] = ()
    env_dicts: tuple[str, ...] = ()
    cache_dtype_names: tuple[str, ...] = ()
    backend_enums: tuple[str, ...] = ()
    kv_cache_dtype_attributes: tuple[str, ...] = ()
    #: Areas whose changed files are attention backend code (the questions count them).
    backend_areas: tuple[str, ...] = ()


@dataclass
class Group:
    """One titled node of the rules tree; area, streams and risk are inherited by `sub`."""

    title: str
    area: str
    streams: tuple[str, ...]
    risk: bool
    why: str = ""
    globs: list["Glob"] = field(default_factory=list)
    ignore: list["Glob"] = field(default_factory=list)
    sub: list["Group"] = field(default_factory=list)
    parent: "Group | None" = None

    def title_path(self) -> str:
        """Titles from the top-level group down to this one, joined with " / "."""
        return self.title if self.parent is None else f"{self.parent.title_path()} / {self.title}"


@dataclass(frozen=True)
class Classification:
    """Where one path lands: the claiming group (None means "other") and every matching area."""

    group: Group | None
    labels: tuple[str, ...]
    ignored_by: str | None

    @property
    def area(self) -> str:
        return self.group.area if self.group else OTHER_AREA

    @property
    def streams(self) -> tuple[str, ...]:
        return self.group.streams if self.group else ()

    @property
    def risk(self) -> bool:
        return self.group.risk if self.group else False


@dataclass
class Rules:
    """A parsed rules file."""

    title: str
    source: str
    keywords: tuple[str, ...]
    ignore: list["Glob"]
    groups: list[Group]
    semantic: SemanticRules
    files_per_topic: int
    #: The SPECs the rules pin (`[fork]`, `[upstream]`): what `diff` compares when given none.
    fork: str | None = None
    upstream: str | None = None

    def classify(self, path: str) -> Classification:
        """Classify PATH (a `/`-separated path relative to the tree root)."""
        claimed: Group | None = None
        for group in self.groups:
            claimed = _deepest_match(group, path)
            if claimed:
                break
        labels = tuple(dict.fromkeys(g.area for g in _all_groups(self.groups) if _matches(g, path)))
        ignored_by = next((g.pattern for g in self.ignore if g.matches(path)), None)
        node = claimed
        while ignored_by is None and node is not None:
            ignored_by = next((g.pattern for g in node.ignore if g.matches(path)), None)
            node = node.parent
        return Classification(claimed, labels or (OTHER_AREA,), ignored_by)

    def risk_areas(self) -> list[str]:
        return list(dict.fromkeys(g.area for g in _all_groups(self.groups) if g.risk))


@dataclass(frozen=True)
class Glob:
    """A path glob: `*` and `?` stay within one directory, `**` spans directories."""

    pattern: str
    regex: re.Pattern[str]

    @classmethod
    def compile(cls, pattern: str) -> "Glob":
        # A trailing slash names a whole directory, as in a .gitignore.
        text = pattern + "**" if pattern.endswith("/") else pattern
        parts, position = [], 0
        while position < len(text):
            if text.startswith("**/", position):
                parts.append("(?:.*/)?")
                position += 3
            elif text.startswith("**", position):
                parts.append(".*")
                position += 2
            elif text[position] == "*":
                parts.append("[^/]*")
                position += 1
            elif text[position] == "?":
                parts.append("[^/]")
                position += 1
            else:
                parts.append(re.escape(text[position]))
                position += 1
        return cls(pattern, re.compile("".join(parts) + r"\Z", re.DOTALL))

    def matches(self, path: str) -> bool:
        return self.regex.match(path) is not None


def _matches(group: Group, path: str) -> bool:
    return any(glob.matches(path) for glob in group.globs)


def _deepest_match(group: Group, path: str) -> Group | None:
    for child in group.sub:
        found = _deepest_match(child, path)
        if found:
            return found
    return group if _matches(group, path) else None


def _all_groups(groups: list[Group]) -> list[Group]:
    return [g for group in groups for g in (group, *_all_groups(group.sub))]


def load_rules(path: Path | None = None) -> Rules:
    """Read and validate a rules file; None reads the vLLM rules shipped with forkaudit."""
    if path is None:
        resource = files("forkaudit") / "rules" / DEFAULT_RULES_NAME
        return parse_rules(resource.read_text(encoding="utf-8"), f"forkaudit:{DEFAULT_RULES_NAME}")
    try:
        # Not blocking on open, and only a regular file is read: a FIFO would wait for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                msg = f"{str(path)!r} is not a regular file (a FIFO, a device or a folder)"
                raise RulesFileError(msg)
            data = file.read(MAX_RULES_BYTES + 1)
    except OSError as error:
        msg = f"cannot read {str(path)!r}: {error.strerror}"
        raise RulesFileError(msg) from None
    if len(data) > MAX_RULES_BYTES:
        msg = f"{str(path)!r} is larger than {MAX_RULES_BYTES} bytes; expected a small TOML file"
        raise RulesFileError(msg)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        msg = f"{str(path)!r} is not UTF-8 text"
        raise RulesFileError(msg) from None
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str) -> Rules:
    """Parse the TOML TEXT of a rules file (SOURCE names it in errors)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        msg = f"{source}: {error}"
        raise RulesFileError(msg) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        msg = f"{source}: values nest too deeply to parse"
        raise RulesFileError(msg) from None
    _reject_unknown(document, _TOP_KEYS, source)
    title = _typed(document, "title", str, source, default="Fork audit")
    groups_raw = _typed(document, "group", list, source, default=[])
    if not groups_raw:
        msg = f"{source}: `group` must list at least one group"
        raise RulesFileError(msg)
    semantic_raw = _typed(document, "semantic", dict, source, default={})
    _reject_unknown(semantic_raw, _SEMANTIC_KEYS, f"{source} [semantic]")
    history_raw = _typed(document, "history", dict, source, default={})
    _reject_unknown(history_raw, _HISTORY_KEYS, f"{source} [history]")
    files_per_topic = _positive_int(history_raw, "files_per_topic", f"{source} [history]", 20)
    return Rules(
        title=title,
        source=source,
        keywords=tuple(_strings(document, "keywords", source)),
        ignore=[Glob.compile(p) for p in _strings(document, "ignore", source)],
        groups=[
            _parse_group(raw, None, f"{source} group[{i}]") for i, raw in enumerate(groups_raw)
        ],
        semantic=SemanticRules(
            **{key: tuple(_strings(semantic_raw, key, source)) for key in _SEMANTIC_KEYS}
        ),
        files_per_topic=files_per_topic,
        fork=_parse_side(document, "fork", source),
        upstream=_parse_side(document, "upstream", source),
    )


def _parse_group(raw: object, parent: Group | None, where: str, depth: int = 1) -> Group:
    if not isinstance(raw, dict):
        msg = f"{where}: a group must be a table, got {type(raw).__name__}"
        raise RulesFileError(msg)
    if depth > MAX_GROUP_DEPTH:
        msg = f"{where}: groups nest more than {MAX_GROUP_DEPTH} levels deep"
        raise RulesFileError(msg)
    _reject_unknown(raw, _GROUP_KEYS, where)
    title = _typed(raw, "title", str, where, default="")
    if not title:
        msg = f"{where}: `title` is required"
        raise RulesFileError(msg)
    where = f"{where} ({title!r})"
    area = _typed(raw, "area", str, where, default=parent.area if parent else "")
    if not area:
        msg = f"{where}: `area` is required on a top-level group"
        raise RulesFileError(msg)
    streams = tuple(_strings(raw, "streams", where)) if "streams" in raw else None
    if streams is not None and not set(streams) <= set(STREAMS):
        msg = f"{where}: `streams` must only hold {', '.join(STREAMS)}, got {list(streams)}"
        raise RulesFileError(msg)
    group = Group(
        title=title,
        area=area,
        streams=streams if streams is not None else (parent.streams if parent else ()),
        risk=_typed(raw, "risk", bool, where, default=parent.risk if parent else False),
        why=_typed(raw, "why", str, where, default=""),
        globs=[Glob.compile(p) for p in _strings(raw, "globs", where)],
        ignore=[Glob.compile(p) for p in _strings(raw, "ignore", where)],
        parent=parent,
    )
    group.sub = [
        _parse_group(child, group, f"{where} sub[{i}]", depth + 1)
        for i, child in enumerate(_typed(raw, "sub", list, where, default=[]))
    ]
    return group


def _parse_side(document: dict[str, Any], side: str, source: str) -> str | None:
    """The SPEC of `[SIDE] source`, or None where the rules pin no such side."""
    if side not in document:
        return None
    where = f"{source} [{side}]"
    table = _typed(document, side, dict, source, default={})
    _reject_unknown(table, _SIDE_KEYS, where)
    spec = _typed(table, "source", str, where, default="")
    if not spec.strip():
        msg = f"{where}: `source` must name a SPEC such as 'pypi:vllm==0.18.1', got {spec!r}"
        raise RulesFileError(msg)
    return spec


def _reject_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        msg = f"{where}: unknown key `{unknown[0]}` (expected one of {', '.join(sorted(known))})"
        raise RulesFileError(msg)


def _typed(table: dict[str, Any], key: str, kind: type[_T], where: str, *, default: _T) -> _T:
    value = table.get(key, default)
    # bool is an int in Python, but `files_per_topic = true` is still a mistake.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        msg = f"{where}: `{key}` must be a {kind.__name__}, got {value!r}"
        raise RulesFileError(msg)
    return value


def _positive_int(table: dict[str, Any], key: str, where: str, default: int) -> int:
    value = table.get(key, default)
    # bool is an int in Python, but `files_per_topic = true` is still a mistake.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        msg = f"{where}: `{key}` must be a positive integer, got {value!r}"
        raise RulesFileError(msg)
    return value


def _strings(table: dict[str, Any], key: str, where: str) -> list[str]:
    value = _typed(table, key, list, where, default=[])
    if not all(isinstance(item, str) for item in value):
        msg = f"{where}: `{key}` must be a list of strings, got {value!r}"
        raise RulesFileError(msg)
    return value
