"""The plugin hooks check: does the fork still offer every upstream symbol a plugin relies on?

A hooks file (TOML; kvquant ships its vLLM plugin's as `kvquant/vllm_plugin/upstream_hooks.toml`)
declares, per supported upstream release, each symbol the plugin patches, subclasses, calls or
reads, with what it needs of it: its kind, the members it reads, the parameters it calls or
wraps, the values it needs. The plugin's import guard checks the same declarations on the live
vLLM at run time; here they are checked in the fork's source before it ever runs.

Each hook is found in the upstream's source and in the fork's (`_symbols`: `ast`, imports
followed, nothing imported) and classified: `unchanged` (the same definition, layout and
comments aside; for a class hook with members, the same members), `changed` (with the first
changed lines of the definition), or `missing` (the module, the name or a member is gone). What
to do follows: nothing; `review` a changed hook that still offers what is declared; `adapt` the
plugin to a hook that is missing or no longer offers it (the plugin's guard refuses that fork).
A hook the upstream itself lacks means the file and the upstream do not match: that is an
error, not a finding.
"""

import difflib
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from forkaudit._errors import HooksError, HooksFileError
from forkaudit._report import EXCERPT_CHARS, EXCERPT_LINES
from forkaudit._snapshot import LARGE_FILE_BYTES, MODE_GITLINK, MODE_SYMLINK, Snapshot
from forkaudit._symbols import (
    SYMBOL_KINDS,
    Definition,
    LookupProblem,
    SourceTree,
    SymbolNotFound,
    parameters,
    read_version,
    string_values,
)
from forkaudit._treediff import blob_sizes, cat_blobs

HookStatus = Literal["unchanged", "changed", "missing"]
HOOK_STATUSES: tuple[HookStatus, ...] = get_args(HookStatus)
HookAction = Literal["none", "review", "adapt"]
HOOK_ACTIONS: tuple[HookAction, ...] = get_args(HookAction)
#: Why a hook is missing (the first four) or changed beyond review (the last three): its
#: module's file is gone, its module binds no such name, its class lacks a declared member, its
#: file does not parse; it is another kind of definition, takes other parameters, or lacks a
#: declared value.
HookProblem = Literal[
    LookupProblem,
    "kind-differs",
    "parameters-differ",
    "value-missing",
]
HOOK_PROBLEMS: tuple[HookProblem, ...] = get_args(HookProblem)
_MISSING_PROBLEMS = frozenset({"module-missing", "name-missing", "member-missing"})

#: A hooks file over this size is refused unread; kvquant's is about 12 KB.
MAX_HOOKS_BYTES = 1 << 20
#: In `parameters`, a last entry of "..." lets more parameters follow the ones declared.
MORE_PARAMETERS = "..."

_TOP_KEYS = {"releases", "hook"}
_HOOK_KEYS = {"symbol", "kind", "why", "releases", "members", "parameters", "values"}
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RELEASE = re.compile(r"\d+\.\d+\.\d+")


@dataclass(frozen=True)
class DeclaredHook:
    """One upstream symbol the plugin relies on, and what it needs of it."""

    module: str
    qualname: str
    kind: str
    why: str
    #: Names a class hook must offer (fields, enum members, attributes, methods), inherited or
    #: its own; only these are compared, not the whole class.
    members: tuple[str, ...] = ()
    #: A function's parameters as `inspect.signature` lists them (`self`/`cls` first), exactly;
    #: `MORE_PARAMETERS` last lets more follow.
    parameters: tuple[str, ...] | None = None
    #: Strings a value must name (a Literal's values, a dict's keys).
    values: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class HookList:
    """A parsed hooks file: the releases it supports and the hooks of each."""

    source: str
    releases: tuple[str, ...]
    hooks: dict[str, tuple[DeclaredHook, ...]]

    @property
    def package(self) -> str:
        """The top-level package every hook lives in (`vllm`)."""
        return next(h for hs in self.hooks.values() for h in hs).module.split(".")[0]


def load_hooks(path: Path) -> HookList:
    """Read and validate a hooks file."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_HOOKS_BYTES + 1)
    except OSError as error:
        msg = f"cannot read {str(path)!r}: {error.strerror}"
        raise HooksFileError(msg) from None
    if len(data) > MAX_HOOKS_BYTES:
        msg = f"{str(path)!r} is larger than {MAX_HOOKS_BYTES} bytes; expected a small TOML file"
        raise HooksFileError(msg)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        msg = f"{str(path)!r} is not UTF-8 text"
        raise HooksFileError(msg) from None
    return parse_hooks(text, str(path))


def parse_hooks(text: str, source: str) -> HookList:
    """Parse the TOML TEXT of a hooks file (SOURCE names it in errors)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise HooksFileError(f"{source}: {error}") from None
    except RecursionError:
        raise HooksFileError(f"{source}: values nest too deeply to parse") from None
    _reject_unknown(document, _TOP_KEYS, source)
    releases = tuple(_strings(document, "releases", source, required=True))
    for release in releases:
        if not _RELEASE.fullmatch(release):
            raise HooksFileError(f"{source}: release {release!r} is not MAJOR.MINOR.PATCH")
    hooks: dict[str, list[DeclaredHook]] = {release: [] for release in releases}
    raw_hooks = document.get("hook")
    if not isinstance(raw_hooks, list) or not raw_hooks:
        raise HooksFileError(f"{source}: `hook` must list at least one [[hook]] table")
    for index, raw in enumerate(raw_hooks):
        where = f"{source} hook[{index}]"
        if not isinstance(raw, dict):
            raise HooksFileError(f"{where}: a hook must be a table, got {type(raw).__name__}")
        hook, hook_releases = _parse_hook(raw, where, releases)
        for release in hook_releases:
            if any(h.symbol == hook.symbol for h in hooks[release]):
                raise HooksFileError(f"{where}: {hook.symbol} is declared twice for {release}")
            hooks[release].append(hook)
    packages = {h.module.split(".")[0] for hs in hooks.values() for h in hs}
    if len(packages) != 1:
        raise HooksFileError(f"{source}: hooks span packages {sorted(packages)}; expected one")
    return HookList(source, releases, {r: tuple(hs) for r, hs in hooks.items()})


def _parse_hook(
    raw: dict[str, Any], where: str, releases: tuple[str, ...]
) -> tuple[DeclaredHook, tuple[str, ...]]:
    _reject_unknown(raw, _HOOK_KEYS, where)
    symbol = _string(raw, "symbol", where)
    module, colon, qualname = symbol.partition(":")
    if not colon or not _DOTTED.match(module) or not _DOTTED.match(qualname):
        example = "'vllm.config:ModelConfig'"
        msg = f"{where}: `symbol` must be MODULE:NAME such as {example}, got {symbol!r}"
        raise HooksFileError(msg)
    where = f"{where} ({symbol})"
    kind = _string(raw, "kind", where)
    if kind not in SYMBOL_KINDS:
        msg = f"{where}: `kind` must be one of {', '.join(SYMBOL_KINDS)}, got {kind!r}"
        raise HooksFileError(msg)
    hook_releases = tuple(_strings(raw, "releases", where)) or releases
    unknown = sorted(set(hook_releases) - set(releases))
    if unknown:
        msg = f"{where}: release {unknown[0]!r} is not among `releases` ({', '.join(releases)})"
        raise HooksFileError(msg)
    members = tuple(_strings(raw, "members", where))
    params = _strings(raw, "parameters", where) if "parameters" in raw else None
    values = tuple(_strings(raw, "values", where))
    if members and kind != "class":
        raise HooksFileError(f"{where}: `members` is for a class, and this is a {kind}")
    if params is not None and kind not in ("function", "classmethod", "staticmethod"):
        raise HooksFileError(f"{where}: `parameters` is for a function, and this is a {kind}")
    if values and kind != "value":
        raise HooksFileError(f"{where}: `values` is for a value, and this is a {kind}")
    for name in (*members, *(p for p in params or [] if p != MORE_PARAMETERS)):
        if not _IDENTIFIER.match(name):
            raise HooksFileError(f"{where}: {name!r} is not a Python name")
    if params is not None and MORE_PARAMETERS in params[:-1]:
        raise HooksFileError(f"{where}: {MORE_PARAMETERS!r} may only end `parameters`")
    hook = DeclaredHook(
        module=module,
        qualname=qualname,
        kind=kind,
        why=_string(raw, "why", where),
        members=members,
        parameters=tuple(params) if params is not None else None,
        values=values,
    )
    return hook, hook_releases


def _reject_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        msg = f"{where}: unknown key `{unknown[0]}` (expected one of {', '.join(sorted(known))})"
        raise HooksFileError(msg)


def _string(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise HooksFileError(f"{where}: `{key}` must be a non-empty string, got {value!r}")
    return value


def _strings(table: dict[str, Any], key: str, where: str, *, required: bool = False) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise HooksFileError(f"{where}: `{key}` must be a list of non-empty strings, got {value!r}")
    if required and not value:
        raise HooksFileError(f"{where}: `{key}` must list at least one entry")
    if len(set(value)) != len(value):
        raise HooksFileError(f"{where}: `{key}` lists an entry twice: {value!r}")
    return value


@dataclass(frozen=True)
class Location:
    """Where a definition lives: its file from the tree root and its first line."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class HookResult:
    """One hook, where it lives on each side, how the fork differs, and what to do."""

    hook: DeclaredHook
    status: HookStatus
    action: HookAction
    upstream: Location
    fork: Location | None = None
    problem: HookProblem | None = None
    #: The module, name, member, parameter list or kind the problem is about.
    detail: str | None = None
    #: The first changed lines of a changed definition, `-` upstream, `+` fork.
    excerpt: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "symbol": self.hook.symbol,
            "kind": self.hook.kind,
            "members": list(self.hook.members),
            "why": self.hook.why,
            "status": self.status,
            "action": self.action,
            "problem": self.problem,
            "detail": self.detail,
            "upstream_path": self.upstream.path,
            "upstream_line": self.upstream.line,
            "fork_path": self.fork.path if self.fork else None,
            "fork_line": self.fork.line if self.fork else None,
            "excerpt": list(self.excerpt),
        }


@dataclass(frozen=True)
class HookCheck:
    """The hooks of one release, each checked against the upstream and the fork."""

    source: str
    release: str
    #: The version the fork's source reports (`vllm/_version.py`), if it has one.
    fork_version: str | None
    results: tuple[HookResult, ...]

    def count(self, status: HookStatus) -> int:
        return sum(result.status == status for result in self.results)

    def to_review(self) -> list[HookResult]:
        """The hooks the gate fails on: changed or missing."""
        return [result for result in self.results if result.status != "unchanged"]

    def summary(self) -> str:
        """One English line: how many hooks of how many changed or are missing, and which."""
        changed, missing = self.count("changed"), self.count("missing")
        line = (
            f"Plugin hooks (vLLM {self.release}): {len(self.results)} checked, "
            f"{changed} changed, {missing} missing"
        )
        named = ", ".join(f"{r.hook.symbol} {r.status}" for r in self.to_review())
        return f"{line} ({named})" if named else line

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "release": self.release,
            "fork_version": self.fork_version,
            "checked": len(self.results),
            **{status: self.count(status) for status in HOOK_STATUSES},
            "hooks": [result.to_dict() for result in self.results],
        }


def snapshot_reader(side: Snapshot) -> Callable[[str], bytes | None]:
    """Read a regular file of SIDE by its path; None where SIDE has none. A file over
    `LARGE_FILE_BYTES` is not read: it counts as unparsable."""

    def read(path: str) -> bytes | None:
        entry = side.entries.get(path.encode())
        if entry is None or entry.mode in (MODE_SYMLINK, MODE_GITLINK):
            return None
        if side.git_dir is not None and entry.oid not in side.sizes:
            side.sizes.update(blob_sizes(side.git_dir, [entry.oid]))
        if side.sizes.get(entry.oid, 0) > LARGE_FILE_BYTES:
            raise SymbolNotFound("unparsable", path)
        if entry.oid in side.blobs:
            return side.blobs[entry.oid]
        if side.git_dir is None:  # a large file's content is never kept
            raise SymbolNotFound("unparsable", path)
        return cat_blobs(side.git_dir, [entry.oid])[entry.oid]

    return read


def check_hooks(
    hooks: HookList,
    upstream: Snapshot,
    fork: Snapshot,
    *,
    release: str | None = None,
) -> HookCheck:
    """Check the hooks of RELEASE (default: the release the fork's source reports, as the
    plugin picks its hooks by `vllm.__version__`) in UPSTREAM and FORK."""
    upstream_tree = SourceTree(snapshot_reader(upstream))
    fork_tree = SourceTree(snapshot_reader(fork))
    fork_version = read_version(fork_tree, hooks.package)
    chosen = _release(hooks, release, fork_version, fork.spec)
    results, upstream_problems = [], []
    for hook in hooks.hooks[chosen]:
        try:
            before = _locate(upstream_tree, hook)
        except SymbolNotFound as missing:
            upstream_problems.append(f"{hook.symbol}: {missing.problem} {missing.detail}")
            continue
        problem = _unmet(hook, before[0])
        if problem is not None:
            upstream_problems.append(f"{hook.symbol}: {problem[0]} ({problem[1]})")
            continue
        results.append(_classify(hook, before, fork_tree))
    if upstream_problems:
        msg = (
            f"the upstream {upstream.spec} does not offer {len(upstream_problems)} of the "
            f"{len(hooks.hooks[chosen])} hooks {hooks.source} declares for {hooks.package} "
            f"{chosen} (first: {upstream_problems[0]}); is the upstream {hooks.package} "
            f"{chosen}? (--hooks-version picks another release)"
        )
        raise HooksError(msg)
    return HookCheck(hooks.source, chosen, fork_version, tuple(results))


def _release(hooks: HookList, given: str | None, fork_version: str | None, fork: str) -> str:
    """The release whose hooks apply: GIVEN, else the one FORK_VERSION (`0.18.1+cpu`) is."""
    supported = ", ".join(hooks.releases)
    if given is not None:
        if given not in hooks.releases:
            msg = f"--hooks-version {given!r}: {hooks.source} declares hooks for {supported}"
            raise HooksError(msg)
        return given
    if fork_version is None:
        msg = (
            f"cannot tell which {hooks.package} release the fork {fork} is: it has no "
            f"{hooks.package}/_version.py; give --hooks-version (one of {supported})"
        )
        raise HooksError(msg)
    release = _RELEASE.match(fork_version)
    if release is None or release.group(0) != fork_version.split("+")[0]:
        chosen = None
    else:
        chosen = release.group(0) if release.group(0) in hooks.releases else None
    if chosen is None:
        msg = (
            f"the fork {fork} reports {hooks.package} {fork_version}, and {hooks.source} "
            f"declares hooks for {supported} only (the plugin refuses any other); give "
            "--hooks-version to check against one of them"
        )
        raise HooksError(msg)
    return chosen


def _locate(tree: SourceTree, hook: DeclaredHook) -> tuple[Definition, list[Definition]]:
    """The hook's definition, and what of it is compared: its declared members, or itself."""
    definition = tree.find(hook.module, hook.qualname)
    if not hook.members:
        return definition, [definition]
    return definition, [tree.member(definition, member) for member in hook.members]


def _unmet(hook: DeclaredHook, definition: Definition) -> tuple[HookProblem, str] | None:
    """What the definition does not offer of the declaration, with its detail; None if all."""
    if definition.kind != hook.kind:
        return "kind-differs", definition.kind
    if hook.parameters is not None:
        found = parameters(definition) or []
        declared = list(hook.parameters)
        if declared[-1:] == [MORE_PARAMETERS]:
            declared, found_head = declared[:-1], found[: len(declared) - 1]
        else:
            found_head = found
        if found_head != declared:
            return "parameters-differ", ", ".join(found)
    if hook.values:
        offered = string_values(definition) or set()
        lacking = [value for value in hook.values if value not in offered]
        if lacking:
            return "value-missing", lacking[0]
    return None


def _classify(
    hook: DeclaredHook, before: tuple[Definition, list[Definition]], fork: SourceTree
) -> HookResult:
    upstream = Location(before[0].path, before[0].line)
    try:
        after = _locate(fork, hook)
    except SymbolNotFound as missing:
        status: HookStatus = "missing" if missing.problem in _MISSING_PROBLEMS else "changed"
        return HookResult(
            hook, status, "adapt", upstream, problem=missing.problem, detail=missing.detail
        )
    location = Location(after[0].path, after[0].line)
    if [d.dump for d in before[1]] == [d.dump for d in after[1]]:
        return HookResult(hook, "unchanged", "none", upstream, location)
    excerpt = _excerpt(_text(before[1]), _text(after[1]))
    unmet = _unmet(hook, after[0])
    if unmet is None:
        return HookResult(hook, "changed", "review", upstream, location, excerpt=excerpt)
    return HookResult(
        hook, "changed", "adapt", upstream, location, unmet[0], unmet[1], excerpt=excerpt
    )


def _text(definitions: list[Definition]) -> list[str]:
    return [line for definition in definitions for line in definition.text.splitlines()]


def _excerpt(before: list[str], after: list[str]) -> tuple[str, ...]:
    """The first changed lines from BEFORE to AFTER, `-` or `+` first, each cut as a finding's
    excerpt is."""
    changed = [
        line
        for line in difflib.unified_diff(before, after, lineterm="", n=0)
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    ]
    return tuple(
        line if len(line) <= EXCERPT_CHARS else line[: EXCERPT_CHARS - 1] + "…"
        for line in changed[:EXCERPT_LINES]
    )
