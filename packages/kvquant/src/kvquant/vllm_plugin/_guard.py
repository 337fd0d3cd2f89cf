"""How the plugin guards itself against a vLLM whose internals differ from what it was written for.

- **The declared hooks.** ``upstream_hooks.toml``, beside this module, declares per supported vLLM
  release every upstream symbol the plugin patches, subclasses, calls or reads, with what it
  needs of it (its kind, members, parameters, values). ``check_declared_hooks`` checks each on
  the live vLLM before any hook is installed (each version's ``check()`` calls it first) and
  refuses, naming the first that differs. forkaudit reads the same file to check a fork's source
  before a nightly (``forkaudit diff --hooks``), so what the audit vouches for is what this guard
  checks.
- **The config guard**, the one hook that does not depend on the vLLM version: where an
  engine's config is settled. Every vLLM with the v1 engine builds a ``VllmConfig`` and hands it,
  once settled, to ``current_platform.check_and_update_config(vllm_config)``. The plugin wraps that
  method of the current platform's class so it can look at ``vllm_config.cache_config.cache_dtype``
  in the front process, before a model is loaded or an engine process started. For any other
  dtype the wrapper returns what the original returned and does nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import tomllib
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import IncompatibleVLLMError, VLLMPluginError

_GUARD_MARK = "_kvquant_int8_guard"
# Where the plugin's wrappers keep what they wrapped (``_hooks_v0_18``, ``_platforms``, the config
# guard): the declared check looks at vLLM's own definition, before or after install().
_WRAPPED_MARKS = ("_kvquant_original", _GUARD_MARK)

#: The declared hooks, shipped with the plugin; forkaudit reads it by this path.
UPSTREAM_HOOKS_FILE = Path(__file__).with_name("upstream_hooks.toml")
#: In a hook's ``parameters``, a last "..." lets more parameters follow.
MORE_PARAMETERS = "..."
_HOOK_KINDS = ("class", "function", "classmethod", "staticmethod", "property", "value")
_HOOK_KEYS = {"symbol", "kind", "why", "releases", "members", "parameters", "values"}

Expect = Callable[[bool, str], None]


@dataclass(frozen=True)
class DeclaredHook:
    """One upstream symbol the plugin relies on; ``upstream_hooks.toml`` says what each key
    means."""

    symbol: str  # MODULE:NAME
    kind: str
    why: str
    members: tuple[str, ...] = ()
    parameters: tuple[str, ...] | None = None
    values: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.symbol.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.symbol.partition(":")[2]


def declared_hooks(
    vllm_version: str, hooks_file: Path = UPSTREAM_HOOKS_FILE
) -> tuple[DeclaredHook, ...]:
    """The hooks ``hooks_file`` declares for a supported release (``"0.18.1"``).

    Raises:
        VLLMPluginError: the file is not a valid hooks file, or declares no such release.
    """
    where = hooks_file.name
    try:
        document = tomllib.loads(hooks_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise VLLMPluginError(f"its declared hooks file {where} cannot be read: {error}") from None
    releases = document.get("releases", [])
    if set(document) != {"releases", "hook"} or vllm_version not in releases:
        raise VLLMPluginError(
            f"its declared hooks file {where} has no hooks for vLLM {vllm_version} "
            f"(releases: {releases})"
        )
    hooks = []
    for raw in document["hook"]:
        unknown = set(raw) - _HOOK_KEYS
        if unknown or raw.get("kind") not in _HOOK_KINDS or ":" not in raw.get("symbol", ""):
            raise VLLMPluginError(f"its declared hooks file {where} has an invalid hook {raw}")
        if vllm_version not in raw.get("releases", releases):
            continue
        parameters = raw.get("parameters")
        hooks.append(
            DeclaredHook(
                symbol=raw["symbol"],
                kind=raw["kind"],
                why=raw["why"],
                members=tuple(raw.get("members", ())),
                parameters=None if parameters is None else tuple(parameters),
                values=tuple(raw.get("values", ())),
            )
        )
    return tuple(hooks)


def check_declared_hooks(
    vllm_version: str,
    expect: Expect,
    unimportable: Collection[str] = (),
    hooks_file: Path = UPSTREAM_HOOKS_FILE,
) -> None:
    """Check every hook declared for ``vllm_version`` on the live vLLM; ``expect`` refuses on
    the first that differs. Hooks in ``unimportable`` modules (another platform's, which import
    only on that platform) are left to the version's own source checks."""
    for hook in declared_hooks(vllm_version, hooks_file):
        if hook.module not in unimportable:
            _check_hook(hook, expect)


_ABSENT = object()


def _check_hook(hook: DeclaredHook, expect: Expect) -> None:
    try:
        owner: Any = importlib.import_module(hook.module)
    except ImportError as error:
        missing = f"{hook.module} does not import ({error})"
    else:
        missing = ""
    # Refused outside the except block: the stored refusal must not carry the ImportError along.
    expect(not missing, missing)
    for part in hook.qualname.split("."):
        # A class attribute as defined (a classmethod object, not a bound method); a module's
        # through getattr, so names a module's __getattr__ provides count too.
        found = (
            inspect.getattr_static(owner, part, _ABSENT)
            if isinstance(owner, type)
            else getattr(owner, part, _ABSENT)
        )
        expect(found is not _ABSENT, f"{hook.symbol} is missing")
        owner = found
    expect(_kind(owner) == hook.kind, f"{hook.symbol} is a {_kind(owner)}, not a {hook.kind}")
    if hook.members:
        offered = _members(owner)
        lacking = [member for member in hook.members if member not in offered]
        expect(not lacking, f"{hook.symbol} has no {', '.join(lacking)}")
    if hook.parameters is not None:
        found_parameters = list(inspect.signature(_wrapped_function(owner)).parameters)
        declared = list(hook.parameters)
        if declared[-1:] == [MORE_PARAMETERS]:
            declared = declared[:-1]
            found_parameters = found_parameters[: len(declared)]
        expect(
            found_parameters == declared,
            f"{hook.symbol} does not take ({', '.join(hook.parameters)})",
        )
    if hook.values:
        offered_values = _values(owner)
        lacking = [value for value in hook.values if value not in offered_values]
        expect(not lacking, f"{hook.symbol} has no {', '.join(lacking)}")


def _kind(found: Any) -> str:
    if isinstance(found, type):
        return "class"
    if isinstance(found, classmethod):
        return "classmethod"
    if isinstance(found, staticmethod):
        return "staticmethod"
    if isinstance(found, property | functools.cached_property):
        return "property"
    if inspect.isfunction(found):
        return "function"
    return "value"


def _wrapped_function(found: Any) -> Any:
    """The function vLLM defined: out of its classmethod/staticmethod, and out of any wrapper
    the plugin installed over it."""
    function = found.__func__ if isinstance(found, classmethod | staticmethod) else found
    for mark in _WRAPPED_MARKS:
        function = getattr(function, mark, function)
    return function


def _members(cls: type) -> set[str]:
    """Every name a class offers: attributes and methods (inherited too), enum members,
    dataclass and NamedTuple fields, and annotated names (declared fields without a default)."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names |= {field.name for field in dataclasses.fields(cls)}
    names |= set(getattr(cls, "_fields", ()))
    for klass in cls.__mro__:
        names |= set(inspect.get_annotations(klass))
    return names


def _values(found: Any) -> set[Any]:
    """The values a Literal allows, a mapping's keys, or a collection's elements."""
    if typing.get_origin(found) is typing.Literal:
        return set(typing.get_args(found))
    if isinstance(found, Mapping):
        return set(found)
    return set(found) if isinstance(found, Collection) else set()


def install_config_guard(decide: Callable[[Any], None]) -> None:
    """After the platform settles a config, call ``decide(vllm_config)``; it may raise a refusal.

    Installing twice in one process (vLLM loads plugins once per process, tests call ``register``
    again) replaces the decision and does not stack wrappers.
    """
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    current = inspect.getattr_static(platform_cls, "check_and_update_config", None)
    if not isinstance(current, classmethod):
        raise IncompatibleVLLMError(
            f"{platform_cls.__name__}.check_and_update_config is not a classmethod in this vLLM; "
            "the plugin cannot see the engine's --kv-cache-dtype"
        )
    original = getattr(current.__func__, _GUARD_MARK, current.__func__)
    parameters = list(inspect.signature(original).parameters)
    if parameters[1:] != ["vllm_config"]:
        raise IncompatibleVLLMError(
            f"{platform_cls.__name__}.check_and_update_config takes {parameters[1:]}; "
            "expected (vllm_config)"
        )

    def check_and_update_config(cls: type, vllm_config: Any) -> Any:
        result = original(cls, vllm_config)
        decide(vllm_config)
        return result

    setattr(check_and_update_config, _GUARD_MARK, original)
    check_and_update_config.__doc__ = original.__doc__
    platform_cls.check_and_update_config = classmethod(check_and_update_config)
