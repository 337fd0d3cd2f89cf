"""The plugin's declared upstream hooks (``upstream_hooks.toml``) and the guard that checks them.

Runs without vLLM: the guard's checks are driven against real modules the tests write, and the
declarations are held to the names the plugin's other checks use. On an installed vLLM
(``nox -s vllm``) every version's ``check()`` runs the declared checks first
(``test_plugin_vllm_config.py``, ``test_plugin_v0_18.py``); forkaudit checks the same file in a
fork's source (``flows/tests/test_audit.py`` reads it with forkaudit's parser).
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kvquant.vllm_plugin import (
    SUPPORTED_VLLM_VERSIONS,
    UPSTREAM_HOOKS_FILE,
    IncompatibleVLLMError,
    VLLMPluginError,
)
from kvquant.vllm_plugin._guard import check_declared_hooks, declared_hooks
from kvquant.vllm_plugin._impl import (
    _BUILD_PARAMETERS,
    _CAPTURE_BUILD_PARAMETERS,
    _COMMON_METADATA_FIELDS,
    _CONFIG_FIELDS,
    _FORWARD_PARAMETERS,
    _IMPL_PARAMETERS,
    GRAPH_SUPPORT,
    HOST_SEQ_LENS_FIELDS,
)
from kvquant.vllm_plugin._platforms import SELECTOR_PARAMETERS, expect_for, platform_hooks


def _by_symbol(version: str) -> dict[str, Any]:
    return {hook.symbol: hook for hook in declared_hooks(version)}


def test_the_declared_releases_are_the_supported_vllm_versions() -> None:
    document = tomllib.loads(UPSTREAM_HOOKS_FILE.read_text(encoding="utf-8"))
    assert tuple(document["releases"]) == tuple(sorted(SUPPORTED_VLLM_VERSIONS))
    for version in SUPPORTED_VLLM_VERSIONS:
        assert len(declared_hooks(version)) >= 30
    with pytest.raises(VLLMPluginError, match=r"has no hooks for vLLM 0\.19\.0"):
        declared_hooks("0.19.0")


@pytest.mark.parametrize("version", SUPPORTED_VLLM_VERSIONS)
def test_the_declarations_hold_what_the_layer_and_selector_checks_read(version: str) -> None:
    """``_impl.check_layer_api`` and ``_platforms``' source checks keep their own names; each
    must be what the declaration says, or the audit would vouch for other hooks than those."""
    hooks = _by_symbol(version)
    backend = "vllm.v1.attention.backend"
    assert hooks[f"{backend}:AttentionImpl.__init__"].parameters == ("self", *_IMPL_PARAMETERS)
    assert hooks[f"{backend}:AttentionImpl.forward"].parameters == ("self", *_FORWARD_PARAMETERS)
    builder = f"{backend}:AttentionMetadataBuilder"
    assert hooks[f"{builder}.build"].parameters == ("self", *_BUILD_PARAMETERS)
    assert hooks[f"{builder}.build_for_cudagraph_capture"].parameters == (
        "self",
        *_CAPTURE_BUILD_PARAMETERS,
    )
    common = set(hooks[f"{backend}:CommonAttentionMetadata"].members)
    assert set(_COMMON_METADATA_FIELDS) <= common
    assert len(set(HOST_SEQ_LENS_FIELDS) & common) == 1  # the one this release has
    assert GRAPH_SUPPORT in hooks[f"{backend}:AttentionCGSupport"].members
    for class_name, fields in _CONFIG_FIELDS.items():
        assert set(fields) <= set(hooks[f"vllm.config:{class_name}"].members), class_name
    for platform in platform_hooks("backends").values():
        selector = hooks[f"{platform.module}:{platform.selector_class}.get_attn_backend_cls"]
        assert (selector.kind, selector.parameters) == (
            "classmethod",
            ("cls", *SELECTOR_PARAMETERS),
        )
        guard = hooks[f"{platform.module}:{platform.selector_class}.check_and_update_config"]
        assert (guard.kind, guard.parameters) == ("classmethod", ("cls", "vllm_config"))


# A module standing in for an upstream release, and declarations of it: real code, imported by
# the guard as it imports vLLM's modules.
SHIM = """\
import enum
from dataclasses import dataclass
from typing import Literal

CacheDType = Literal["auto", "int8_per_token_head"]
DTYPES = {"auto": None, "int8_per_token_head": "int8"}


@dataclass
class Spec:
    block_size: int
    head_size: int = 64


class Level(enum.Enum):
    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1


class Platform:
    device_name: str

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        return "theirs"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size):
        return (num_blocks, block_size)

    @property
    def is_cpu(self):
        return True


def register_backend(backend, class_path=None, is_mamba=False):
    return class_path
"""
HOOKS = """\
releases = ["1.0.0"]

[[hook]]
symbol = "{m}:CacheDType"
kind = "value"
values = ["int8_per_token_head"]
why = "x"

[[hook]]
symbol = "{m}:DTYPES"
kind = "value"
values = ["int8_per_token_head"]
why = "x"

[[hook]]
symbol = "{m}:Spec"
kind = "class"
members = ["block_size", "head_size"]
why = "x"

[[hook]]
symbol = "{m}:Level"
kind = "class"
members = ["UNIFORM_SINGLE_TOKEN_DECODE"]
why = "x"

[[hook]]
symbol = "{m}:Platform"
kind = "class"
members = ["device_name", "is_cpu"]
why = "x"

[[hook]]
symbol = "{m}:Platform.get_attn_backend_cls"
kind = "classmethod"
parameters = ["cls", "selected_backend", "attn_selector_config", "num_heads"]
why = "x"

[[hook]]
symbol = "{m}:Platform.get_kv_cache_shape"
kind = "staticmethod"
parameters = ["num_blocks", "block_size"]
why = "x"

[[hook]]
symbol = "{m}:Platform.is_cpu"
kind = "property"
why = "x"

[[hook]]
symbol = "{m}:register_backend"
kind = "function"
parameters = ["backend", "class_path", "..."]
why = "x"
"""
_names = (f"kvquant_test_shim_{n}" for n in itertools.count())


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A fresh module (its own name: imports are cached per process) and its hooks file."""
    name = next(_names)
    (tmp_path / f"{name}.py").write_text(SHIM)
    monkeypatch.syspath_prepend(str(tmp_path))
    hooks = tmp_path / "hooks.toml"
    hooks.write_text(HOOKS.replace("{m}", name))
    return name, hooks


def _check(hooks: Path, unimportable: tuple[str, ...] = ()) -> None:
    check_declared_hooks("1.0.0", expect_for("1.0.0"), unimportable, hooks_file=hooks)


def test_a_release_that_offers_every_declared_hook_passes(shim: tuple[str, Path]) -> None:
    _check(shim[1])


@pytest.mark.parametrize(
    ("old", "new", "refusal"),
    [
        ('members = ["block_size", "head_size"]', 'members = ["block_size", "causal"]',
         ":Spec has no causal"),
        ('members = ["UNIFORM_SINGLE_TOKEN_DECODE"]', 'members = ["ALWAYS"]',
         ":Level has no ALWAYS"),
        ('"attn_selector_config", "num_heads"]', '"attn_selector_config"]',
         ":Platform.get_attn_backend_cls does not take "
         "(cls, selected_backend, attn_selector_config)"),
        ('parameters = ["backend", "class_path", "..."]', 'parameters = ["backend", "path", "..."]',
         ":register_backend does not take (backend, path, ...)"),
        ('kind = "staticmethod"', 'kind = "classmethod"',
         ":Platform.get_kv_cache_shape is a staticmethod, not a classmethod"),
        ('symbol = "{m}:Platform.is_cpu"\nkind = "property"',
         'symbol = "{m}:Platform.is_cpu"\nkind = "function"',
         ":Platform.is_cpu is a property, not a function"),
        ('symbol = "{m}:DTYPES"', 'symbol = "{m}:DTYPE_MAP"', ":DTYPE_MAP is missing"),
        ('values = ["int8_per_token_head"]\nwhy = "x"\n\n[[hook]]\nsymbol = "{m}:DTYPES"',
         'values = ["fp8"]\nwhy = "x"\n\n[[hook]]\nsymbol = "{m}:DTYPES"',
         ":CacheDType has no fp8"),
    ],
    ids=["field", "enum-member", "parameters", "leading-parameters", "kind", "property",
         "name", "literal-value"],
)  # fmt: skip
def test_a_release_that_differs_from_a_declaration_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, refusal: str
) -> None:
    name = next(_names)
    (tmp_path / f"{name}.py").write_text(SHIM)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert old in HOOKS, old
    hooks = tmp_path / "hooks.toml"
    hooks.write_text(HOOKS.replace(old, new).replace("{m}", name))
    with pytest.raises(IncompatibleVLLMError) as error:
        _check(hooks)
    message = str(error.value)
    assert f"{name}{refusal}" in message, message
    assert message.startswith("kvquant: vLLM reports 1.0.0 but ") and "\n" not in message


def test_a_module_that_does_not_import_is_refused_unless_another_platform_owns_it(
    shim: tuple[str, Path],
) -> None:
    name, hooks = shim
    missing = f"{name}_gone"
    hooks.write_text(
        hooks.read_text() + f'\n[[hook]]\nsymbol = "{missing}:Thing"\nkind = "class"\nwhy = "x"\n'
    )
    with pytest.raises(IncompatibleVLLMError, match=f"{missing} does not import"):
        _check(hooks)
    _check(hooks, unimportable=(missing,))  # another platform's module: its source is checked


def test_the_plugins_own_wrappers_do_not_hide_what_they_wrapped(shim: tuple[str, Path]) -> None:
    """register() runs check() again after install(): the guard looks through the plugin's
    wrappers (marked as ``_platforms`` and ``_hooks_v0_18`` mark them) at vLLM's definition."""
    import importlib

    name, hooks = shim
    platform = importlib.import_module(name).Platform
    original = platform.__dict__["get_attn_backend_cls"].__func__

    def get_attn_backend_cls(cls: type, *args: Any) -> str:
        return "kvquant's"

    get_attn_backend_cls._kvquant_original = original  # type: ignore[attr-defined]
    platform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    _check(hooks)
