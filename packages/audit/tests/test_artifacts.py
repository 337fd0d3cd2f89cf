"""sdist, wheel, installed and pypi sources, built from a tiny package inside the tests."""

import base64
import hashlib
import http.server
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

import forkaudit

from conftest import commit_tree

TINY_FILES = {
    "pyproject.toml": b"""\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tinypkg"
version = "0.1.0"
readme = "README.md"

[tool.setuptools]
packages = ["tinypkg"]
""",
    "README.md": b"# tinypkg\n",
    "tinypkg/__init__.py": b"from tinypkg.core import answer\n",
    "tinypkg/core.py": b"def answer():\n    return 42\n",
}


@dataclass(frozen=True)
class Tiny:
    repo: Path
    sdist: Path
    wheel: Path


def _build(project: Path, hook: str, out: Path) -> Path:
    """Call setuptools' PEP 517 hook directly: no isolation, no network."""
    code = f"from setuptools.build_meta import {hook}; print({hook}({str(out)!r}))"
    name = subprocess.run(
        [sys.executable, "-c", code], cwd=project, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    return out / name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    root = tmp_path_factory.mktemp("tiny")
    repo = git.Repo.init(root / "repo", initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test")
        config.set_value("user", "email", "test@example.com")
    commit_tree(repo, TINY_FILES, "tiny 0.1.0")
    build = root / "build"
    # Build from an export so that the build's own files never enter the repository.
    export = root / "export"
    for path, data in TINY_FILES.items():
        (export / path).parent.mkdir(parents=True, exist_ok=True)
        (export / path).write_bytes(data)
    build.mkdir()
    return Tiny(
        root / "repo", _build(export, "build_sdist", build), _build(export, "build_wheel", build)
    )


def test_sdist_matches_its_source_and_lists_what_the_build_added(tiny: Tiny) -> None:
    report = forkaudit.diff(f"sdist:{tiny.sdist}", f"git:{tiny.repo}@HEAD")
    assert report.summary()["total"] == 0
    left_out = {entry["path"]: (entry["side"], entry["code"]) for entry in report.left_out}
    assert left_out.pop("PKG-INFO") == ("fork", "sdist-metadata")
    assert left_out.pop("setup.cfg") == ("fork", "egg-info-section")
    assert left_out, "the egg-info files"
    assert all(p.startswith("tinypkg.egg-info/") for p in left_out)
    assert set(left_out.values()) == {("fork", "egg-info-metadata")}
    reasons = {entry["code"]: entry["reason"] for entry in report.left_out}
    assert reasons["sdist-metadata"] == "sdist metadata written by the build"


def test_sdist_against_a_later_commit_shows_the_change(tiny: Tiny, tmp_path: Path) -> None:
    clone = git.Repo.clone_from(tiny.repo, tmp_path / "later")
    with clone.config_writer() as config:
        config.set_value("user", "name", "Test")
        config.set_value("user", "email", "test@example.com")
    commit_tree(clone, {**TINY_FILES, "tinypkg/core.py": b"def answer():\n    return 43\n"}, "43")
    report = forkaudit.diff(f"git:{tmp_path / 'later'}@HEAD", f"sdist:{tiny.sdist}")
    assert [(f.status, f.path, f.lines_added, f.lines_removed) for f in report.files] == [
        ("M", "tinypkg/core.py", 1, 1)
    ]


@pytest.mark.parametrize(
    ("keep", "why"),
    [
        (0.5, "its compressed stream ends early (the file is truncated)"),
        (0.0, "empty file"),
    ],
)
def test_broken_sdist_is_a_one_line_error(
    tiny: Tiny, tmp_path: Path, keep: float, why: str
) -> None:
    data = tiny.sdist.read_bytes()
    broken = tmp_path / tiny.sdist.name
    broken.write_bytes(data[: int(len(data) * keep)])  # truncated, or empty
    expected = (
        f"`sdist:{broken}`: file {str(broken)!r} is not a readable tar archive "
        f"(.tar.gz, .tar.bz2 or .tar.xz): {why}"
    )
    with pytest.raises(forkaudit.SpecError) as raised:
        forkaudit.diff(f"sdist:{broken}", f"git:{tiny.repo}")
    assert str(raised.value) == expected


def test_wheel_in_scope_matches_the_source(tiny: Tiny) -> None:
    report = forkaudit.diff(f"wheel:{tiny.wheel}", f"git:{tiny.repo}", scope="tinypkg/")
    document = report.to_dict()
    assert document["summary"]["total"] == 0  # type: ignore[index]
    assert document["record_mismatches"] == {"fork": [], "upstream": []}
    fork = document["fork"]
    assert isinstance(fork, dict)
    assert fork["files"] == 2


def test_installed_files_are_checked_against_record(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(tiny.wheel) as wheel:  # a pure-Python install is an unpacked wheel
        wheel.extractall(site)  # noqa: S202 (a zip built by this test)
    monkeypatch.syspath_prepend(str(site))
    clean = forkaudit.diff("installed:tinypkg", f"git:{tiny.repo}", scope="tinypkg/")
    assert clean.summary()["total"] == 0
    assert clean.verdict()["surprise"] is False
    (site / "tinypkg" / "core.py").write_bytes(b"def answer():\n    return 0\n")
    patched = forkaudit.diff("installed:tinypkg", f"git:{tiny.repo}", scope="tinypkg/")
    assert patched.record_mismatches["fork"] == [
        {
            "path": "tinypkg/core.py",
            "code": "content-differs",
            "algorithm": "sha256",
            "problem": "content does not match its RECORD sha256 hash",
        }
    ]
    assert [(f.status, f.path) for f in patched.files] == [("M", "tinypkg/core.py")]
    verdict = patched.verdict()
    assert verdict["surprise"] is True
    assert [(f.stream, f.path, f.area, f.change, f.reason) for f in patched.findings()] == [
        (
            None,
            "tinypkg/core.py",
            "other",
            "record-content-differs",
            "patched after install: content does not match its RECORD sha256 hash",
        )
    ]
    assert verdict["risk_files_by_stream"] == {"A": 0, "B": 0, "C": 0, "none": 1}
    markdown = patched.to_markdown()
    outside = markdown.split("### Outside the plan's streams\n")[1].split("\n#")[0]
    assert "| `tinypkg/core.py` | patched after install: content does not match" in outside
    assert "Stream -" not in markdown


def _isolated_pip_env(monkeypatch: pytest.MonkeyPatch, index_url: str) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index_url)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")


def test_pypi_spec_reads_pips_index_and_caches(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project_page = tmp_path / "simple" / "tinypkg"
    project_page.mkdir(parents=True)
    sha256 = hashlib.sha256(tiny.sdist.read_bytes()).hexdigest()
    (project_page / "index.html").write_text(
        f'<a href="{tiny.sdist.as_uri()}#sha256={sha256}">{tiny.sdist.name}</a>\n'
    )
    _isolated_pip_env(monkeypatch, (tmp_path / "simple").as_uri())
    cache = tmp_path / "cache"
    report = forkaudit.diff("pypi:tinypkg==0.1.0", f"git:{tiny.repo}", cache_dir=cache)
    assert report.summary()["total"] == 0
    assert (cache / "tinypkg" / tiny.sdist.name).read_bytes() == tiny.sdist.read_bytes()
    # Offline now: the cached copy must serve.
    _isolated_pip_env(monkeypatch, "http://127.0.0.1:9/simple")
    again = forkaudit.diff("pypi:tinypkg==0.1.0", f"git:{tiny.repo}", cache_dir=cache)
    assert again.summary()["total"] == 0


def test_pypi_offline_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolated_pip_env(monkeypatch, "http://127.0.0.1:9/simple")
    with pytest.raises(forkaudit.FetchError, match=r"no sdist of tinypkg==0\.1\.0 .*unreachable"):
        forkaudit.diff("pypi:tinypkg==0.1.0", "pypi:tinypkg==0.1.0", cache_dir=tmp_path)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_large_archive_members_are_hashed_as_git_does_and_checked_against_record(
    tmp_path: Path,
) -> None:
    # Two large members of a wheel, one true to its RECORD hash, one not; the same content as
    # an sdist (with a hard link) and as a directory must give the same blob ids.
    large = b"0123456789abcdef" * (forkaudit.LARGE_FILE_BYTES // 16 + 1)
    files = {"pkg/true.bin": large, "pkg/patched.bin": large[:-1] + b"!", "pkg/small.py": b"x\n"}
    record = "".join(
        f"{path},{_record_hash(large if path == 'pkg/patched.bin' else data)},{len(data)}\n"
        for path, data in files.items()
    )
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr("pkg-1.0.dist-info/RECORD", record + "pkg-1.0.dist-info/RECORD,,\n")
    tree = tmp_path / "tree"
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)
    sdist = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz", compresslevel=1) as archive:
        for path in files:
            archive.add(tree / path, f"pkg-1.0/{path}")
        link = tarfile.TarInfo("pkg-1.0/pkg/linked.bin")
        link.type, link.linkname = tarfile.LNKTYPE, "pkg-1.0/pkg/true.bin"
        archive.addfile(link)
    (tree / "pkg" / "linked.bin").write_bytes(large)

    from_wheel = forkaudit.diff(f"wheel:{wheel}", f"dir:{tree}", scope="pkg/")
    assert [m["path"] for m in from_wheel.record_mismatches["fork"]] == ["pkg/patched.bin"]
    assert from_wheel.record_mismatches["fork"][0]["code"] == "content-differs"
    # The wheel lacks only the hard link's copy; every other id matches the directory's.
    assert [(f.status, f.path, f.large) for f in from_wheel.files] == [
        ("D", "pkg/linked.bin", True)
    ]
    from_sdist = forkaudit.diff(f"sdist:{sdist}", f"dir:{tree}")
    assert from_sdist.files == []
    assert from_sdist.to_dict()["fork"] == {  # the same tree id git gives the directory
        **from_sdist.to_dict()["upstream"],  # type: ignore[dict-item]
        "spec": f"sdist:{sdist}",
        "kind": "sdist",
    }


@pytest.mark.parametrize(
    "page",
    [
        b"[" * 100_000 + b"]" * 100_000,  # nested deeper than the JSON parser recurses
        b'{"files": [{"filename": 7, "url": "x"}]}',
        b"not json",
    ],
)
def test_a_malformed_index_page_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: bytes
) -> None:
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _isolated_pip_env(monkeypatch, f"http://127.0.0.1:{server.server_port}/simple")
        with pytest.raises(forkaudit.FetchError) as raised:
            forkaudit.diff("pypi:tinypkg==0.1.0", "pypi:tinypkg==0.1.0", cache_dir=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert str(raised.value).endswith("not a simple-API JSON page (PEP 691))")
