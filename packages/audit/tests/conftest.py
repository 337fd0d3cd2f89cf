"""Real git repositories, built with GitPython, that every test reads (and never writes).

- `upstream`: six commits on one line, tagged v0.1.0 (c1), v0.1.1 (c3) and v0.2.0 (c6).
- `fork`: v0.1.1 plus known patches, published as one orphan commit with a misleading message.
- `fork2`: c4 plus two vendor patches, one orphan commit, for find-base and attribution.
"""

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

ENVS_PY = """\
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    VLLM_A: str = "1"
    VLLM_B: int = 0

environment_variables = {{
    "VLLM_A": lambda: os.getenv("VLLM_A", "{a_default}"),
    "VLLM_B": lambda: int(os.environ.get("VLLM_B", "0")),
{extra}}}
"""

CACHE_PY = "from typing import Literal\n\nCacheDType = Literal[{values}]\n"

REGISTRY_PY = """\
from enum import Enum


class AttentionBackendEnum(Enum):
    FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
{extra}"""

TRITON_ATTN_PY = """\
class TritonAttentionBackend:
    supported_kv_cache_dtypes = [{values}]

    def forward(self):
        return None
"""

# Long enough that a one-line edit still lets git pair the rename.
OLD_NAME_PY = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(30))

NON_UTF8_PATH = b"docs/caf\xe9.md"
GITLINK_COMMIT = "1234567890abcdef1234567890abcdef12345678"


def base_files() -> dict[str, bytes]:
    """The tree of upstream's first commit (v0.1.0)."""
    return {
        ".gitignore": b"*.log\nbuild/\n",
        "vllm/__init__.py": b'__version__ = "0.1.0"\n',
        "vllm/envs.py": ENVS_PY.format(a_default="1", extra="").encode(),
        "vllm/config/cache.py": CACHE_PY.format(values='"auto", "fp8"').encode(),
        "vllm/v1/attention/backends/registry.py": REGISTRY_PY.format(extra="").encode(),
        "vllm/v1/attention/backends/triton_attn.py": TRITON_ATTN_PY.format(
            values='"auto", "fp8"'
        ).encode(),
        "vllm/platforms/rocm.py": b"def device_name():\n    return 'rocm'\n",
        "vllm/core/block_pool.py": b"class BlockPool:\n    size = 16\n",
        "vllm/worker.py": b"def run():\n    return 1\n",
        "vllm/utils/old_name.py": OLD_NAME_PY.encode(),
        "vllm/data/keep.log": b"tracked although .gitignore matches it\n",
        "scripts/run.sh": b"#!/bin/sh\necho run\n",
        "assets/logo.bin": bytes(range(256)) * 4,
        "docs/index.md": b"# vLLM\n",
        "tests/test_x.py": b"def test_x():\n    assert True\n",
        "csrc/kernel.cu": b"__global__ void k() {}\n",
    }


def commit_tree(
    repo: git.Repo, files: dict[str, bytes], message: str, modes: dict[str, str] | None = None
) -> str:
    """Make the work tree hold exactly FILES, commit everything, return the commit id.

    MODES maps a path to `exec`, `symlink:TARGET` or, for a gitlink, the commit id it points at.
    """
    root = Path(repo.working_tree_dir or "")
    tracked = repo.git.ls_files("-z").split("\0") if repo.head.is_valid() else []
    for path in filter(None, tracked):
        if path not in files:
            repo.git.rm("--cached", "--quiet", "--", path)
            (root / path).unlink(missing_ok=True)
    for path, data in files.items():
        target = root / path  # a non-UTF-8 name arrives surrogate-escaped and is written as bytes
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data)
        target.chmod(0o644)
    modes = modes or {}
    for path, mode in modes.items():
        if mode == "exec":
            (root / path).chmod(0o755)
        elif mode.startswith("symlink:"):
            (root / path).symlink_to(mode.removeprefix("symlink:"))
    repo.git.add("--all", "--force", "--", ".")
    for path, mode in modes.items():
        if mode != "exec" and not mode.startswith("symlink:"):
            repo.git.update_index("--add", "--cacheinfo", f"160000,{mode},{path}")
    repo.git.commit("--quiet", "--allow-empty", "-m", message)
    return repo.head.commit.hexsha


@dataclass(frozen=True)
class Repos:
    """The repositories and the commits the tests refer to."""

    upstream: Path
    fork: Path
    fork2: Path
    commits: dict[str, str]


def _new_repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test")
        config.set_value("user", "email", "test@example.com")
    return repo


def fork_files() -> dict[str, bytes]:
    """v0.1.1's tree with the vendor's known patches (see test_diff.py for the list)."""
    files = base_files()
    files["tests/test_x.py"] = b"def test_x():\n    assert 1\n"  # upstream c2/c3 changes
    files["docs/index.md"] = b"# vLLM\n\nRelease notes.\n"
    files["vllm/utils/new_name.py"] = files.pop("vllm/utils/old_name.py") + b"# vendor\n"
    files["assets/logo.bin"] = bytes(reversed(range(256))) * 4
    files["vllm/data/keep.log"] = b"patched by the vendor\n"
    files["vllm/envs.py"] = ENVS_PY.format(
        a_default="0", extra='    "VLLM_HYGON_INT8": lambda: os.getenv("VLLM_HYGON_INT8", "1"),\n'
    ).encode()
    files["vllm/config/cache.py"] = CACHE_PY.format(values='"auto", "fp8", "int8"').encode()
    files["vllm/v1/attention/backends/registry.py"] = REGISTRY_PY.format(
        extra='    HYGON_ATTN = "vllm.v1.attention.backends.hygon.HygonBackend"\n'
    ).encode()
    files["vllm/v1/attention/backends/triton_attn.py"] = TRITON_ATTN_PY.format(
        values='"auto", "fp8", "int8"'
    ).encode()
    files[os.fsdecode(NON_UTF8_PATH)] = b"# Caf\xc3\xa9\n"
    return files


@pytest.fixture(scope="session")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Repos:
    root = tmp_path_factory.mktemp("repos")
    upstream = _new_repo(root / "upstream")
    files = base_files()
    commits = {"c1": commit_tree(upstream, files, "c1: initial")}
    upstream.create_tag("v0.1.0")
    files["docs/index.md"] = b"# vLLM\n\nRelease notes.\n"
    commits["c2"] = commit_tree(upstream, files, "c2: docs")
    files["tests/test_x.py"] = b"def test_x():\n    assert 1\n"
    commits["c3"] = commit_tree(upstream, files, "c3: tests")
    upstream.create_tag("v0.1.1")
    files["vllm/core/block_pool.py"] = b"class BlockPool:\n    size = 32\n"
    commits["c4"] = commit_tree(upstream, files, "c4: bigger blocks")
    files["vllm/worker.py"] = b"def run():\n    return 2\n"
    files["docs/index.md"] = b"# vLLM\n\nMore release notes.\n"
    commits["c5"] = commit_tree(upstream, files, "c5: worker")
    files["vllm/core/block_pool.py"] = b"class BlockPool:\n    size = 64\n"
    files["vllm/new_feature.py"] = b"FEATURE = True\n"
    commits["c6"] = commit_tree(upstream, files, "c6: feature")
    upstream.create_tag("v0.2.0")

    fork = _new_repo(root / "fork")
    commits["fork"] = commit_tree(
        fork,
        fork_files(),
        "[Arch] Support bmz and nmz",
        {
            "scripts/run.sh": "exec",
            "vllm/latest": "symlink:platforms/rocm.py",
            "third_party/sub": GITLINK_COMMIT,
        },
    )

    fork2 = _new_repo(root / "fork2")
    files2 = {**base_files(), **_c4_changes()}
    files2["vllm/platforms/rocm.py"] = b"def device_name():\n    return 'hygon dtk'\n"
    files2["vllm/worker.py"] = b"def run():\n    return 3\n"
    commits["fork2"] = commit_tree(fork2, files2, "Sync")
    return Repos(root / "upstream", root / "fork", root / "fork2", commits)


def _c4_changes() -> dict[str, bytes]:
    return {
        "docs/index.md": b"# vLLM\n\nRelease notes.\n",
        "tests/test_x.py": b"def test_x():\n    assert 1\n",
        "vllm/core/block_pool.py": b"class BlockPool:\n    size = 32\n",
    }


def git_cli(repo: Path, *args: str) -> bytes:
    """Plain git, as a person would run it, to get the answer forkaudit must match."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, check=True, env=env
    ).stdout
