"""The plugin hooks check: declared upstream symbols found in real forks' source and classified.

The upstream is a small vLLM-shaped tree in a real git repository; each fork is the same tree
with one kind of change, committed to its own repository (one is also packed as a wheel
against an sdist of the upstream). The hooks file is written by the tests in the format kvquant
ships its vLLM plugin's in.
"""

import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import git
import pytest

import forkaudit
from forkaudit.__main__ import main

SELECTOR_DEF = (
    "    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):\n"
)
UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '0.9.0'\n",
    "vllm/config/__init__.py": (
        "from vllm.config.cache import CacheConfig\n"
        "from .model import ModelConfig\n\n"
        "__all__ = ['CacheConfig', 'ModelConfig']\n"
    ),
    "vllm/config/cache.py": (
        "from dataclasses import dataclass\n"
        "from typing import Literal\n\n"
        'CacheDType = Literal["auto", "fp8"]\n\n\n'
        "@dataclass\n"
        "class CacheConfig:\n"
        "    block_size: int = 16\n"
        '    cache_dtype: CacheDType = "auto"\n'
        "    swap_space: float = 4.0\n"
    ),
    "vllm/config/model.py": (
        "class ModelConfig:\n"
        "    max_model_len: int = 2048\n\n"
        "    def get_num_attention_heads(self, parallel_config):\n"
        "        return 8\n"
    ),
    "vllm/v1/attention/backend.py": (
        "from dataclasses import dataclass\n"
        "from enum import Enum\n"
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n"
        "    from vllm.config import ModelConfig\n\n\n"
        "class AttentionCGSupport(Enum):\n"
        "    ALWAYS = 3\n"
        "    UNIFORM_SINGLE_TOKEN_DECODE = 1\n"
        "    NEVER = 0\n\n\n"
        "@dataclass\n"
        "class _Batch:\n"
        "    seq_lens: list[int]\n\n\n"
        "@dataclass\n"
        "class CommonAttentionMetadata(_Batch):\n"
        "    num_reqs: int\n"
        "    causal: bool = True\n"
    ),
    "vllm/v1/attention/selector.py": (
        "from vllm.config.cache import CacheDType\n\n\n"
        "def valid(dtype):\n"
        "    return dtype in CacheDType.__args__\n"
    ),
    "vllm/v1/attention/backends/registry.py": (
        "def register_backend(backend, class_path=None, is_mamba=False):\n"
        "    return (backend, class_path, is_mamba)\n"
    ),
    "vllm/platforms/rocm.py": (
        "class Platform:\n"
        "    @classmethod\n"
        f"{SELECTOR_DEF}"
        "        raise NotImplementedError\n\n\n"
        "class RocmPlatform(Platform):\n"
        "    @classmethod\n"
        f"{SELECTOR_DEF}"
        "        return 'vllm.v1.attention.backends.triton_attn.TritonAttentionBackend'\n"
    ),
    "vllm/worker.py": "def run():\n    return 1\n",
}

HOOKS = """\
releases = ["0.9.0", "0.10.0"]

[[hook]]
symbol = "vllm.config.cache:CacheDType"
kind = "value"
values = ["auto"]
why = "The KV-cache dtype literal."

[[hook]]
symbol = "vllm.v1.attention.selector:CacheDType"
kind = "value"
why = "The selector's copy of the literal."

[[hook]]
symbol = "vllm.config:CacheConfig"
kind = "class"
members = ["cache_dtype", "block_size"]
why = "The engine's KV-cache dtype and block size."

[[hook]]
symbol = "vllm.config:ModelConfig.get_num_attention_heads"
kind = "function"
parameters = ["self", "parallel_config", "..."]
why = "The builder sizes its scratch by it."

[[hook]]
symbol = "vllm.v1.attention.backend:CommonAttentionMetadata"
kind = "class"
members = ["seq_lens", "num_reqs", "causal"]
why = "The batch the builder reads."

[[hook]]
symbol = "vllm.v1.attention.backend:AttentionCGSupport"
kind = "class"
members = ["UNIFORM_SINGLE_TOKEN_DECODE"]
why = "The graph support the builder declares."

[[hook]]
symbol = "vllm.v1.attention.backends.registry:register_backend"
kind = "function"
parameters = ["backend", "class_path", "..."]
why = "Registers the backend."

[[hook]]
symbol = "vllm.platforms.rocm:RocmPlatform.get_attn_backend_cls"
kind = "classmethod"
parameters = ["cls", "selected_backend", "attn_selector_config", "num_heads"]
why = "Wrapped on ROCm."

[[hook]]
symbol = "vllm.config:ModelConfig"
kind = "class"
releases = ["0.10.0"]
members = ["max_model_len", "hf_config"]
why = "Only the later release has hf_config."
"""
HOOK_COUNT_0_9 = 8
ROCM_SELECTOR = "vllm.platforms.rocm:RocmPlatform.get_attn_backend_cls"
DEEP_NESTING = "x = " + "(" * 5000 + ")" * 5000


def _edit(path: str, old: str, new: str) -> Callable[[dict[str, str]], dict[str, str]]:
    def edit(files: dict[str, str]) -> dict[str, str]:
        assert old in files[path], (path, old)
        return files | {path: files[path].replace(old, new)}

    return edit


def _tree(*edits: Callable[[dict[str, str]], dict[str, str]]) -> dict[str, str]:
    files = dict(UPSTREAM)
    for edit in edits:
        files = edit(files)
    return files


def _without(path: str) -> Callable[[dict[str, str]], dict[str, str]]:
    return lambda files: {name: text for name, text in files.items() if name != path}


def _repo(path: Path, files: dict[str, str]) -> Path:
    repo = git.Repo.init(path, initial_branch="main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    repo.git.add("--all")
    repo.git.commit("--quiet", "-m", "tree", "--author", "T <t@example.com>")
    return path


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"git:{_repo(tmp_path_factory.mktemp('upstream'), UPSTREAM)}@main"


@pytest.fixture(scope="module")
def hooks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hooks") / "hooks.toml"
    path.write_text(HOOKS)
    return path


def _check(
    upstream: str, hooks_file: Path, tmp_path: Path, files: dict[str, str], **kwargs: str
) -> forkaudit.HookCheck:
    fork = _repo(tmp_path / "fork", files)
    report = forkaudit.diff(str(fork), upstream, hooks=hooks_file, **kwargs)  # type: ignore[arg-type]
    assert report.hooks is not None
    return report.hooks


def _by_symbol(check: forkaudit.HookCheck) -> dict[str, forkaudit.HookResult]:
    return {result.hook.symbol: result for result in check.results}


def test_a_fork_that_only_reformats_moves_or_adds_around_the_hooks_keeps_them_all(
    upstream: str, hooks_file: Path, tmp_path: Path
) -> None:
    literal = 'CacheDType = Literal["auto", "fp8"]\n'
    backend = "vllm/v1/attention/backend.py"
    fork = _tree(
        # Layout and comments are no change.
        _edit("vllm/config/cache.py", "block_size: int = 16\n", "block_size: int = 16  # ok\n"),
        # The literal moves to another module; cache.py re-exports it, so imports still work.
        _edit("vllm/config/cache.py", literal, "from vllm.config.dtypes import CacheDType\n"),
        lambda files: files | {"vllm/config/dtypes.py": f"from typing import Literal\n\n{literal}"},
        # Members the plugin does not read may change: only the declared ones are compared.
        _edit(backend, "    NEVER = 0\n", "    NEVER = 0\n    SOMETIMES = 4\n"),
        _edit(
            backend, "    causal: bool = True\n", "    causal: bool = True\n    extra: int = 0\n"
        ),
        _edit("vllm/_version.py", "'0.9.0'", "'0.9.0+rocm6.2'"),
    )
    check = _check(upstream, hooks_file, tmp_path, fork)
    assert (check.release, check.fork_version) == ("0.9.0", "0.9.0+rocm6.2")
    assert len(check.results) == HOOK_COUNT_0_9
    assert {r.status for r in check.results} == {"unchanged"}
    assert {r.action for r in check.results} == {"none"}
    found = _by_symbol(check)
    # Found where it lives, imports followed: the literal, and the selector's copy of it.
    for symbol in ("vllm.config.cache:CacheDType", "vllm.v1.attention.selector:CacheDType"):
        assert str(found[symbol].upstream) == "vllm/config/cache.py:4"
        assert str(found[symbol].fork) == "vllm/config/dtypes.py:3"
    # A class hook is located at its class; a member may be inherited from a base class.
    assert str(found["vllm.v1.attention.backend:CommonAttentionMetadata"].upstream) == (
        "vllm/v1/attention/backend.py:20"
    )
    assert str(found["vllm.config:ModelConfig.get_num_attention_heads"].upstream) == (
        "vllm/config/model.py:4"
    )
    assert (
        check.summary()
        == f"Plugin hooks (vLLM 0.9.0): {HOOK_COUNT_0_9} checked, 0 changed, 0 missing"
    )


def test_a_fork_that_changes_one_hook_fails_the_gate_naming_it(
    upstream: str,
    hooks_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fork = _repo(
        tmp_path / "fork",
        _tree(
            _edit(
                "vllm/platforms/rocm.py",
                "        return 'vllm.v1.attention.backends.triton_attn.TritonAttentionBackend'\n",
                "        return 'vllm.v1.attention.backends.hygon.HygonBackend'\n",
            )
        ),
    )
    out = tmp_path / "report.json"
    markdown = tmp_path / "report.md"
    argv = ["diff", "--fork", str(fork), "--upstream", upstream, "--hooks", str(hooks_file)]
    argv += ["--json", str(out), "--markdown", str(markdown)]
    assert main(argv) == 0  # the command ran; without the gate it does not fail
    assert main([*argv, "--fail-on-hooks"]) == 1
    stdout = capsys.readouterr().out
    assert (
        f"Plugin hooks (vLLM 0.9.0): {HOOK_COUNT_0_9} checked, 1 changed, 0 missing "
        f"({ROCM_SELECTOR} changed)"
    ) in stdout.splitlines()

    hooks = json.loads(out.read_text())["hooks"]
    assert (hooks["release"], hooks["checked"], hooks["changed"], hooks["missing"]) == (
        "0.9.0",
        HOOK_COUNT_0_9,
        1,
        0,
    )
    (changed,) = [h for h in hooks["hooks"] if h["status"] != "unchanged"]
    assert changed == {
        "symbol": ROCM_SELECTOR,
        "kind": "classmethod",
        "members": [],
        "why": "Wrapped on ROCm.",
        "status": "changed",
        # The signature still holds: the plugin's guard accepts it, a person reviews the body.
        "action": "review",
        "problem": None,
        "detail": None,
        "upstream_path": "vllm/platforms/rocm.py",
        "upstream_line": 8,
        "fork_path": "vllm/platforms/rocm.py",
        "fork_line": 8,
        "excerpt": [
            "-        return 'vllm.v1.attention.backends.triton_attn.TritonAttentionBackend'",
            "+        return 'vllm.v1.attention.backends.hygon.HygonBackend'",
        ],
    }
    text = markdown.read_text()
    assert (
        f"| `{ROCM_SELECTOR}` | `vllm/platforms/rocm.py:8` | changed<br>"
        "`-        return 'vllm.v1.attention.backends.triton_attn.TritonAttentionBackend'`<br>"
        "`+        return 'vllm.v1.attention.backends.hygon.HygonBackend'` "
        "| review the change; the plugin's guard still accepts it |"
    ) in text


@pytest.mark.parametrize(
    ("edits", "symbol", "status", "action", "problem", "detail"),
    [
        (
            [_edit("vllm/v1/attention/backend.py", "    causal: bool = True\n", "")],
            "vllm.v1.attention.backend:CommonAttentionMetadata",
            "missing",
            "adapt",
            "member-missing",
            "causal",
        ),
        (
            [_without("vllm/platforms/rocm.py")],
            ROCM_SELECTOR,
            "missing",
            "adapt",
            "module-missing",
            "vllm.platforms.rocm",
        ),
        (
            # Imported only for type checkers: nothing binds the name when vLLM runs.
            [
                _edit(
                    "vllm/config/__init__.py",
                    "from .model import ModelConfig\n",
                    "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                    "    from .model import ModelConfig\n",
                )
            ],
            "vllm.config:ModelConfig.get_num_attention_heads",
            "missing",
            "adapt",
            "name-missing",
            "vllm.config:ModelConfig",
        ),
        (
            [_edit("vllm/v1/attention/backends/registry.py", "class_path=None", "path=None")],
            "vllm.v1.attention.backends.registry:register_backend",
            "changed",
            "adapt",
            "parameters-differ",
            "backend, path, is_mamba",
        ),
        (
            [
                _edit(
                    "vllm/platforms/rocm.py",
                    "    @classmethod\n    def get_attn_backend_cls(cls, selected_backend, "
                    "attn_selector_config, num_heads=None):\n        return",
                    "    @staticmethod\n    def get_attn_backend_cls(cls, selected_backend, "
                    "attn_selector_config, num_heads=None):\n        return",
                )
            ],
            ROCM_SELECTOR,
            "changed",
            "adapt",
            "kind-differs",
            "staticmethod",
        ),
        (
            [_edit("vllm/config/cache.py", 'Literal["auto", "fp8"]', 'Literal["fp8"]')],
            "vllm.config.cache:CacheDType",
            "changed",
            "adapt",
            "value-missing",
            "auto",
        ),
        (
            # Hostile input: nesting too deep for Python's parser is unparsable, not a crash.
            [lambda files: files | {"vllm/v1/attention/backend.py": DEEP_NESTING}],
            "vllm.v1.attention.backend:CommonAttentionMetadata",
            "changed",
            "adapt",
            "unparsable",
            "vllm/v1/attention/backend.py",
        ),
    ],
    ids=[
        "member-removed",
        "module-removed",
        "import-only-for-type-checkers",
        "parameter-renamed",
        "classmethod-made-static",
        "value-dropped",
        "unparsable-file",
    ],
)  # fmt: skip
def test_a_hook_the_fork_breaks_says_what_it_lacks_and_that_the_plugin_must_adapt(
    upstream: str,
    hooks_file: Path,
    tmp_path: Path,
    edits: list[Callable[[dict[str, str]], dict[str, str]]],
    symbol: str,
    status: str,
    action: str,
    problem: str,
    detail: str,
) -> None:
    found = _by_symbol(_check(upstream, hooks_file, tmp_path, _tree(*edits)))
    result = found[symbol]
    assert (result.status, result.action, result.problem, result.detail) == (
        status,
        action,
        problem,
        detail,
    )
    # Where the fork's definition is, unless it could not be found (or read) at all.
    assert (result.fork is None) == (status == "missing" or problem == "unparsable")


def test_a_missing_hook_fails_the_gate_and_the_record_names_it(
    upstream: str, hooks_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fork = _repo(
        tmp_path / "fork",
        _tree(_edit("vllm/v1/attention/backend.py", "    UNIFORM_SINGLE_TOKEN_DECODE = 1\n", "")),
    )
    argv = ["diff", "--fork", str(fork), "--upstream", upstream, "--hooks", str(hooks_file)]
    assert main([*argv, "--fail-on-hooks"]) == 1
    symbol = "vllm.v1.attention.backend:AttentionCGSupport"
    assert f"0 changed, 1 missing ({symbol} missing)" in capsys.readouterr().out

    report = forkaudit.diff(str(fork), upstream, hooks=hooks_file)
    parts = forkaudit.record_parts(report, {})
    assert "hooks" in forkaudit.RECORD_TABLES
    assert {k: parts.metrics[k] for k in parts.metrics if k.startswith("plugin_hooks")} == {
        "plugin_hooks_release": "0.9.0",
        "plugin_hooks_checked": HOOK_COUNT_0_9,
        "plugin_hooks_changed": 0,
        "plugin_hooks_missing": 1,
    }
    table = parts.tables["hooks"]
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    (missing,) = [row for row in rows if row["status"] == "missing"]
    assert missing == {
        "symbol": symbol,
        "kind": "class",
        "status": "missing",
        "action": "adapt",
        "problem": "member-missing",
        "detail": "UNIFORM_SINGLE_TOKEN_DECODE",
        "upstream_path": "vllm/v1/attention/backend.py",
        "upstream_line": 9,
        "fork_path": None,
        "fork_line": None,
        "excerpt": None,
    }
    assert parts.summary.endswith(f"0 changed, 1 missing ({symbol} missing)")


def test_an_audit_without_a_hooks_file_records_none_checked(upstream: str) -> None:
    # What the pipeline's gate `plugin_hooks_checked >= 1` refuses: an audit that checked none.
    fork = upstream.removeprefix("git:").removesuffix("@main")
    report = forkaudit.diff(fork, upstream)
    assert report.hooks is None and report.to_dict()["hooks"] is None
    parts = forkaudit.record_parts(report, {})
    assert {k: parts.metrics[k] for k in parts.metrics if k.startswith("plugin_hooks")} == {
        "plugin_hooks_release": None,
        "plugin_hooks_checked": 0,
        "plugin_hooks_changed": 0,
        "plugin_hooks_missing": 0,
    }
    assert parts.tables["hooks"].rows == []
    assert "Not checked: no hooks file given (--hooks)." in report.to_markdown()


def test_a_wheel_fork_against_an_sdist_upstream_is_checked_alike(
    hooks_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sdist = tmp_path / "vllm-0.9.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in UPSTREAM.items():
            source = tmp_path / "sdist" / name
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(text)
            archive.add(source, arcname=f"vllm-0.9.0/{name}")
    wheel = tmp_path / "vllm-0.9.0-py3-none-any.whl"
    changed = _tree(_edit("vllm/config/cache.py", '"auto", "fp8"', '"auto", "fp8", "int8"'))
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in changed.items():
            archive.writestr(name, text)
    argv = ["diff", "--fork", f"wheel:{wheel}", "--upstream", f"sdist:{sdist}"]
    assert main([*argv, "--hooks", str(hooks_file), "--fail-on-hooks"]) == 1
    # The literal gained a dtype: changed, in the literal and in the selector's copy of it.
    assert (
        "2 changed, 0 missing (vllm.config.cache:CacheDType changed, "
        "vllm.v1.attention.selector:CacheDType changed)"
    ) in capsys.readouterr().out


def test_the_release_is_the_one_the_fork_reports_or_the_one_given(
    upstream: str, hooks_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(files: dict[str, str], *extra: str) -> tuple[int, str]:
        fork = _repo(tmp_path / f"fork{len(list(tmp_path.iterdir()))}", files)
        argv = ["diff", "--fork", str(fork), "--upstream", upstream, "--hooks", str(hooks_file)]
        code = main([*argv, *extra])
        captured = capsys.readouterr()
        return code, captured.err.strip()

    newer = _tree(_edit("vllm/_version.py", "'0.9.0'", "'0.11.0'"))
    code, error = run(newer)
    assert code == 2
    assert error == (
        f"forkaudit: error: the fork {tmp_path / 'fork0'} reports vllm 0.11.0, and "
        f"{hooks_file} declares hooks for 0.9.0, 0.10.0 only (the plugin refuses any other); "
        "give --hooks-version to check against one of them"
    )
    assert run(newer, "--hooks-version", "0.9.0")[0] == 0
    code, error = run(_tree(_without("vllm/_version.py")))
    assert (
        code == 2
        and "has no vllm/_version.py; give --hooks-version (one of 0.9.0, 0.10.0)" in error
    )
    # The 0.10.0 hooks against a 0.9.0 upstream: the file and the upstream do not match.
    code, error = run(UPSTREAM, "--hooks-version", "0.10.0")
    assert code == 2
    assert (
        "does not offer 1 of the 9 hooks" in error
        and "(first: vllm.config:ModelConfig: member-missing hf_config)" in error
    )
    code, error = run(UPSTREAM, "--hooks-version", "0.8.0")
    assert code == 2 and "declares hooks for 0.9.0, 0.10.0" in error
    fork = upstream.removeprefix("git:").removesuffix("@main")
    for option in (["--fail-on-hooks"], ["--hooks-version", "0.9.0"]):
        assert main(["diff", "--fork", fork, "--upstream", upstream, *option]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"forkaudit: error: {option[0]} needs --hooks FILE")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm:a"\nkind = "value"\nwhy = "x"\nwhen = 1\n',
         "unknown key `when`"),
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm:a"\nkind = "method"\nwhy = "x"\n',
         "`kind` must be one of class, function"),
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm.a"\nkind = "value"\nwhy = "x"\n',
         "`symbol` must be MODULE:NAME"),
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm:f"\nkind = "function"\nwhy = "x"\n'
         'members = ["a"]\n', "`members` is for a class, and this is a function"),
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm:f"\nkind = "function"\nwhy = "x"\n'
         'parameters = ["...", "a"]\n', "'...' may only end `parameters`"),
        ('releases = ["0.9.0"]\n[[hook]]\nsymbol = "vllm:a"\nkind = "value"\nwhy = "x"\n'
         'releases = ["1.0.0"]\n', "release '1.0.0' is not among `releases`"),
        ('releases = ["0.9.0"]\n' + '[[hook]]\nsymbol = "vllm:a"\nkind = "value"\nwhy = "x"\n' * 2,
         "vllm:a is declared twice for 0.9.0"),
        ('releases = ["0.9"]\n[[hook]]\nsymbol = "vllm:a"\nkind = "value"\nwhy = "x"\n',
         "release '0.9' is not MAJOR.MINOR.PATCH"),
        ('releases = ["0.9.0"]\n', "`hook` must list at least one [[hook]] table"),
        ("releases = [", "invalid hooks file"),
    ],
    ids=["unknown-key", "bad-kind", "bad-symbol", "members-on-function", "misplaced-ellipsis",
         "undeclared-release", "duplicate", "bad-release", "no-hooks", "not-toml"],
)  # fmt: skip
def test_a_bad_hooks_file_is_one_line_and_exit_2(
    upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    bad = tmp_path / "hooks.toml"
    bad.write_text(text)
    fork = upstream.removeprefix("git:").removesuffix("@main")
    assert main(["diff", "--fork", fork, "--upstream", upstream, "--hooks", str(bad)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("forkaudit: error: invalid hooks file: ") and message in error
    assert error.count("\n") == 1
