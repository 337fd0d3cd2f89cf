"""The audit stage's record and ADR 0012's blocks, from real audits of small forks.

A git fork adds a KV-cache dtype and an attention backend, re-defaults an env var, and patches
a platform file with lines that hold Markdown and HTML syntax; a wheel "fork" carries build
outputs and a file that fails its RECORD hash; the git fork less one module, checked against a
hooks file, changes two of the hooks it declares and lacks a third. Their records are rendered
in both languages.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import zipfile
from pathlib import Path

import git
import pytest
from markdown_it import MarkdownIt

import forkaudit
from adrkit import render_block, update_adrs, utc_now, write_record
from adrkit._labels import LABELS
from adrkit.schema import Record
from flows._stage import RunContext, stage_record
from flows.audit import STAGE
from kvquant.vllm_plugin import UPSTREAM_HOOKS_FILE
from kvquant.vllm_plugin._guard import declared_hooks

from conftest import REPO_ROOT, other_language

AUDIT_BLOCKS = [
    "audit-summary",
    "audit-questions",
    "audit-findings",
    "audit-changes",
    "audit-left-out",
    "audit-hooks",
]

ENVS = (
    "import os\n\nenvironment_variables = {\n"
    '    "VLLM_A": lambda: os.getenv("VLLM_A", "{a}"),\n{extra}}\n'
)
REGISTRY = (
    "from enum import Enum\n\n\nclass AttentionBackendEnum(Enum):\n"
    '    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"\n{extra}'
)
# Lines a vendor could write to break a table or the ADR's markers.
HOSTILE_LINES = [
    "    return 'a|b'  # <!-- generated:audit-findings end -->",
    "    # ``code`` and --> and *stars*",
]

UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/envs.py": ENVS.replace("{a}", "1").replace("{extra}", ""),
    "vllm/config/cache.py": 'from typing import Literal\n\nCacheDType = Literal["auto", "fp8"]\n',
    "vllm/v1/attention/backends/registry.py": REGISTRY.replace("{extra}", ""),
    "vllm/platforms/rocm.py": "def device_name():\n    return 'rocm'\n",
    "vllm/worker.py": "def run():\n    return 1\n",
}
FORK = UPSTREAM | {
    "vllm/envs.py": ENVS.replace("{a}", "0").replace(
        "{extra}", '    "VLLM_VENDOR_KV": lambda: os.getenv("VLLM_VENDOR_KV", "int8"),\n'
    ),
    "vllm/config/cache.py": (
        'from typing import Literal\n\nCacheDType = Literal["auto", "fp8", "int8"]\n'
    ),
    "vllm/v1/attention/backends/registry.py": REGISTRY.replace(
        "{extra}", '    VENDOR_ATTN = "vllm.v1.attention.backends.vendor.VendorBackend"\n'
    ),
    "vllm/v1/attention/backends/vendor.py": (
        "class VendorBackend:\n    supported_kv_cache_dtypes = ['auto', 'int8']\n"
    ),
    "vllm/platforms/rocm.py": "def device_name():\n" + "\n".join(HOSTILE_LINES) + "\n",
}


def _repo(path: Path, files: dict[str, str]) -> Path:
    repo = git.Repo.init(path, initial_branch="main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    repo.index.add(list(files))
    repo.index.commit("tree", author=git.Actor("T", "t@example.com"))
    return path


def _record(tmp_path: Path, report: forkaudit.AuditReport) -> Record:
    ctx = RunContext("run-audit", tmp_path / "results")
    record = stage_record(ctx, STAGE, utc_now(), forkaudit.record_parts(report, {}))
    write_record(ctx.results_root, record)
    return record


@pytest.fixture(scope="module")
def git_fork(tmp_path_factory: pytest.TempPathFactory) -> tuple[Record, Path]:
    root = tmp_path_factory.mktemp("git-fork")
    upstream, fork = _repo(root / "upstream", UPSTREAM), _repo(root / "fork", FORK)
    return _record(root, forkaudit.diff(str(fork), f"git:{upstream}@main")), root / "results"


# Hooks of the small forks' tree, in the format kvquant ships its vLLM plugin's in.
HOOKS = """\
releases = ["0.1.0"]

[[hook]]
symbol = "vllm.config.cache:CacheDType"
kind = "value"
values = ["auto"]
why = "The KV-cache dtype literal."

[[hook]]
symbol = "vllm.v1.attention.backends.registry:AttentionBackendEnum"
kind = "class"
members = ["TRITON_ATTN"]
why = "The backend registry."

[[hook]]
symbol = "vllm.platforms.rocm:device_name"
kind = "function"
parameters = []
why = "The platform's name."

[[hook]]
symbol = "vllm.worker:run"
kind = "function"
parameters = []
why = "The worker's entry."
"""


@pytest.fixture(scope="module")
def hooks_fork(tmp_path_factory: pytest.TempPathFactory) -> tuple[Record, Path]:
    """The git fork without vllm/worker.py, audited with HOOKS: the literal gained a dtype and
    the platform file changed (two changed hooks), the worker is gone (a missing one), the
    registry's declared member is as it was (its new member is none the plugin reads)."""
    root = tmp_path_factory.mktemp("hooks-fork")
    fork_files = {name: text for name, text in FORK.items() if name != "vllm/worker.py"}
    upstream, fork = _repo(root / "upstream", UPSTREAM), _repo(root / "fork", fork_files)
    hooks = root / "hooks.toml"
    hooks.write_text(HOOKS)
    report = forkaudit.diff(str(fork), f"git:{upstream}@main", hooks=hooks, hooks_version="0.1.0")
    return _record(root, report), root / "results"


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def wheel_fork(tmp_path_factory: pytest.TempPathFactory) -> Record:
    """A wheel of the upstream tree plus its build's outputs, with one file patched after its
    RECORD was written, against the upstream tree with an executable script."""
    root = tmp_path_factory.mktemp("wheel-fork")
    upstream = _repo(root / "upstream", UPSTREAM | {"vllm/run.sh": "#!/bin/sh\n"})
    (upstream / "vllm" / "run.sh").chmod(0o755)
    repo = git.Repo(upstream)
    repo.git.add("--all")
    repo.git.commit("--quiet", "-m", "exec", "--author", "T <t@example.com>")
    files = {name: text.encode() for name, text in UPSTREAM.items()}
    files |= {"vllm/run.sh": b"#!/bin/sh\n", "vllm/_C.abi3.so": b"\x7fELF"}
    files["vllm-0.1.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.1\n"
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files["vllm/worker.py"] = b"def run():\n    return 2\n"  # after RECORD: a post-install patch
    wheel = root / "vllm-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("vllm-0.1.dist-info/RECORD", record + "vllm-0.1.dist-info/RECORD,,\n")
    return _record(root, forkaudit.diff(f"wheel:{wheel}", f"git:{upstream}@main"))


def _table_rows(block: str) -> list[list[str]]:
    """The body rows of the first Markdown table in BLOCK, as raw cell text."""
    lines = [line for line in block.splitlines() if line.startswith("| ")][1:]
    return [re.split(r"(?<!\\)\|", line)[1:-1] for line in lines]


def test_the_questions_are_answered_from_the_semantic_diff_with_their_files(
    git_fork: tuple[Record, Path],
) -> None:
    record, _ = git_fork
    questions = record.tables["questions"]
    assert questions.columns == [
        "question", "answer", "kind", "subject", "change", "name", "old", "new", "path"
    ]  # fmt: skip
    evidence = {(row[0], row[1], *row[2:]) for row in questions.rows}
    assert evidence == {
        ("fp8_kv_cache", "no", None, None, None, None, None, None, None),
        ("int8_kv_cache", "yes", "fact", "cache_dtype", "added", "int8", None, None,
         "vllm/config/cache.py"),
        ("int8_kv_cache", "yes", "fact", "backend_kv_cache_dtype", "added", "VendorBackend",
         None, "int8", "vllm/v1/attention/backends/vendor.py"),
        ("attention_backend", "yes", "fact", "attention_backend", "added",
         "AttentionBackendEnum.VENDOR_ATTN", None,
         "'vllm.v1.attention.backends.vendor.VendorBackend'",
         "vllm/v1/attention/backends/registry.py"),
        ("attention_backend", "yes", "file", None, "M", None, None, None,
         "vllm/v1/attention/backends/registry.py"),
        ("attention_backend", "yes", "file", None, "A", None, None, None,
         "vllm/v1/attention/backends/vendor.py"),
        ("backend_kv_cache_dtypes", "yes", "fact", "backend_kv_cache_dtype", "added",
         "VendorBackend", None, "int8", "vllm/v1/attention/backends/vendor.py"),
        ("backend_kv_cache_dtypes", "yes", "fact", "backend_kv_cache_dtype", "added",
         "VendorBackend", None, "auto", "vllm/v1/attention/backends/vendor.py"),
        ("env_vars", "yes", "fact", "env_var", "added", "VLLM_VENDOR_KV", None, "'int8'",
         "vllm/envs.py"),
        ("env_vars", "yes", "fact", "env_var", "changed", "VLLM_A", "'1'", "'0'",
         "vllm/envs.py"),
    }  # fmt: skip

    zh = _table_rows(render_block("audit-questions", {"audit": record}, "zh"))
    assert [row[:2] for row in zh] == [
        [" 厂商是否新增或修改了 FP8 KV 缓存？ ", " 否 "],
        [" 厂商是否新增或修改了 INT8 KV 缓存？ ", " 是 "],
        [" 厂商是否新增或修改了注意力后端？ ", " 是 "],
        [" 注意力后端接受的 KV 缓存数据类型是否有变化？ ", " 是 "],
        [" 是否新增、删除环境变量，或修改了其默认值？ ", " 是 "],
    ]
    assert zh[1][2].strip().split("<br>") == [
        "新增 KV 缓存数据类型 `int8`：`vllm/config/cache.py`",
        "`VendorBackend` 新增支持 `int8`：`vllm/v1/attention/backends/vendor.py`",
    ]
    en = _table_rows(render_block("audit-questions", {"audit": record}, "en"))
    assert en[4][2].strip().split("<br>") == [
        "env var `VLLM_VENDOR_KV` added (default `'int8'`): `vllm/envs.py`",
        "default of `VLLM_A` changed from `'1'` to `'0'`: `vllm/envs.py`",
    ]


def test_a_finding_shows_its_changed_lines_exactly_and_safely(
    git_fork: tuple[Record, Path], tmp_path: Path
) -> None:
    record, results = git_fork
    findings = record.tables["findings"]
    rocm = next(r for r in findings.rows if r[1] == "vllm/platforms/rocm.py")
    assert rocm[findings.columns.index("excerpt")] == "\n".join(
        ["-    return 'rocm'", *(f"+{line}" for line in HOSTILE_LINES)]
    )
    block = render_block("audit-findings", {"audit": record}, "en")
    assert "<!--" not in block and "-->" not in block
    # A row per change, with every stream it touches.
    assert [(row[0], row[1]) for row in _table_rows(block)] == [
        (" A,B ", " `vllm/config/cache.py` "),
        (" A,B,C ", " `vllm/envs.py` "),
        (" C ", " `vllm/platforms/rocm.py` "),
        (" C ", " `vllm/v1/attention/backends/registry.py` "),
        (" C ", " `vllm/v1/attention/backends/vendor.py` "),
    ]
    html = MarkdownIt("commonmark").enable("table").render(block)
    assert "<code>+    return 'a|b'  # &lt;!-- generated:audit-findings end --&gt;</code>" in html
    assert "<code>+    # ``code`` and --&gt; and *stars*</code>" in html
    # The ADR takes the block, and a second update from the same record changes nothing.
    adr_dir = tmp_path / "adr"
    adr_dir.mkdir()
    shutil.copy(REPO_ROOT / "docs" / "adr" / "0012-vendor-fork-audit.md", adr_dir)
    update_adrs(adr_dir, results)
    written = (adr_dir / "0012-vendor-fork-audit.md").read_text()
    assert written.count("<!-- generated:audit-findings end -->") == 1
    assert not update_adrs(adr_dir, results).changed


@pytest.mark.parametrize("block", AUDIT_BLOCKS)
def test_every_audit_block_speaks_only_its_adrs_language(
    block: str, git_fork: tuple[Record, Path], wheel_fork: Record
) -> None:
    for record in (git_fork[0], wheel_fork):
        zh = render_block(block, {"audit": record}, "zh")
        en = render_block(block, {"audit": record}, "en")
        assert not other_language(zh, "zh"), (block, zh)
        assert not other_language(en, "en"), (block, en)


def test_the_wheel_fork_record_carries_codes_for_every_left_out_file_and_record_problem(
    wheel_fork: Record,
) -> None:
    left_out = {tuple(row) for row in wheel_fork.tables["left-out"].rows}
    assert left_out == {
        ("vllm/_C.abi3.so", "fork", "compiled-output"),
        ("vllm-0.1.dist-info/METADATA", "fork", "wheel-metadata"),
        ("vllm-0.1.dist-info/RECORD", "fork", "wheel-metadata"),
        ("vllm/run.sh", "both", "exec-bit-only"),
    }
    findings = wheel_fork.tables["findings"]
    assert [(r[0], r[1], r[4]) for r in findings.rows] == [
        (None, "vllm/worker.py", "record-content-differs")
    ]
    metrics = wheel_fork.metrics
    assert {k: metrics[k] for k in ("surprise", "vendor_risk_changes", "vendor_risk_files",
                                    "record_mismatch_files", "vendor_risk_no_stream",
                                    "base_given")} == {
        "surprise": True,
        "vendor_risk_changes": 1,
        "vendor_risk_files": 0,
        "record_mismatch_files": 1,
        "vendor_risk_no_stream": 1,
        "base_given": False,
    }  # fmt: skip
    zh = render_block("audit-summary", {"audit": wheel_fork}, "zh")
    # The patched file is no change in a risk area: it fails its RECORD check.
    assert zh.startswith(
        "**结论:** 存在意外补丁：1 个差异文件中有 0 个是落在风险区域内的厂商改动，"
        "另有 1 个分支文件与 RECORD 哈希不符（不属于任何计划流：1）。"
        "未给出真实基线，因此所有改动都算作厂商改动。"
    )


def test_every_code_forkaudit_writes_has_a_label_in_both_languages() -> None:
    codes = {
        "question": forkaudit.QUESTIONS,
        "answer": forkaudit.ANSWERS,
        "change": forkaudit.CHANGE_KINDS,
        "content": tuple(c for c in forkaudit.CONTENT_KINDS if c != "text"),
        "left-out": tuple(forkaudit.LEFT_OUT_REASONS),
        "evidence": tuple(k for k in forkaudit.EVIDENCE_KINDS if k != "fact"),
    }
    keys = {f"{prefix}:{code}" for prefix, values in codes.items() for code in values}
    keys |= {
        f"fact:{subject}:{change}"
        for subject in forkaudit.FACT_SUBJECTS
        for change in forkaudit.FACT_CHANGES
        # Only a backend's registration and an env var's default have a value that changes.
        if change != "changed" or subject in ("attention_backend", "env_var")
    }
    for lang in ("en", "zh"):
        assert keys <= set(LABELS[lang]), sorted(keys - set(LABELS[lang]))


def test_a_fork_that_changes_or_drops_a_hook_fails_the_stage_naming_them(
    hooks_fork: tuple[Record, Path],
) -> None:
    record, _ = hooks_fork
    assert {k: v for k, v in record.metrics.items() if k.startswith("plugin_hooks")} == {
        "plugin_hooks_release": "0.1.0",
        "plugin_hooks_checked": 4,
        "plugin_hooks_changed": 2,
        "plugin_hooks_missing": 1,
    }
    failed = {g.name for g in record.gates if not g.passed}
    assert failed == {"vendor_risk_changes", "plugin_hooks_changed", "plugin_hooks_missing"}
    assert record.status == "failed"
    assert "gate plugin_hooks_changed: 2 not <= 0; gate plugin_hooks_missing: 1 not <= 0" in (
        record.reason or ""
    )
    assert record.summary.endswith(
        "Plugin hooks (vLLM 0.1.0): 4 checked, 2 changed, 1 missing ("
        "vllm.config.cache:CacheDType changed, vllm.platforms.rocm:device_name changed, "
        "vllm.worker:run missing)"
    )
    en = _table_rows(render_block("audit-hooks", {"audit": record}, "en"))
    assert [[cell.strip() for cell in row] for row in en] == [
        [
            "`vllm.config.cache:CacheDType`",
            "`vllm/config/cache.py:3`",
            'changed<br>`-CacheDType = Literal["auto", "fp8"]`<br>'
            '`+CacheDType = Literal["auto", "fp8", "int8"]`',
            "review the change: the plugin's import guard still accepts it",
        ],
        [
            "`vllm.v1.attention.backends.registry:AttentionBackendEnum`",
            "`vllm/v1/attention/backends/registry.py:4`",
            "unchanged",
            "nothing",
        ],
        [
            "`vllm.platforms.rocm:device_name`",
            "`vllm/platforms/rocm.py:1`",
            # The comment after the return is no part of the function's definition; the
            # hostile line shows as code, its comment markers escaped.
            "changed<br>`-    return 'rocm'`<br><code>+    return 'a\\|b'  "
            "# &lt;!-- generated:audit-findings end --&gt;</code>",
            "review the change: the plugin's import guard still accepts it",
        ],
        [
            "`vllm.worker:run`",
            "`vllm/worker.py:1`",
            "missing, module `vllm.worker` is gone",
            "adapt the plugin: its import guard refuses this fork",
        ],
    ]  # fmt: skip
    zh = _table_rows(render_block("audit-hooks", {"audit": record}, "zh"))
    assert [row[3].strip() for row in zh] == [
        "审阅改动：插件的导入检查仍接受它",
        "无需处理",
        "审阅改动：插件的导入检查仍接受它",
        "调整插件：其导入检查会拒绝这个分支",
    ]
    assert zh[3][2].strip() == "缺失，模块 `vllm.worker` 已不存在"


def test_an_audit_given_no_hooks_file_fails_its_gate(git_fork: tuple[Record, Path]) -> None:
    record, _ = git_fork
    checked = next(g for g in record.gates if g.name == "plugin_hooks_checked")
    assert (checked.value, checked.passed) == (0, False)
    assert render_block("audit-hooks", {"audit": record}, "en").startswith(
        "No hook was checked: the audit was given no hooks file."
    )


def test_forkaudit_reads_the_plugins_own_hooks_file_as_the_plugins_guard_does() -> None:
    """One file, two readers: forkaudit's (the audit's gate) and the plugin's (its guard)."""
    audited = forkaudit.load_hooks(UPSTREAM_HOOKS_FILE)
    for release in audited.releases:
        guarded = declared_hooks(release)
        assert [
            (h.symbol, h.kind, h.members, h.parameters, h.values) for h in audited.hooks[release]
        ] == [(h.symbol, h.kind, h.members, h.parameters, h.values) for h in guarded]


def test_every_hook_code_forkaudit_writes_has_a_label_in_both_languages() -> None:
    keys = {f"hook:{status}" for status in forkaudit.HOOK_STATUSES}
    keys |= {f"hook-action:{action}" for action in forkaudit.HOOK_ACTIONS}
    keys |= {f"hook-problem:{problem}" for problem in forkaudit.HOOK_PROBLEMS}
    for lang in ("en", "zh"):
        assert keys <= set(LABELS[lang]), sorted(keys - set(LABELS[lang]))
