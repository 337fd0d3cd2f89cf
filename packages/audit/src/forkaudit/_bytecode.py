"""Python bytecode (`.pyc`) on an artifact side: compared with its source, or reported, never
silently left out.

Python runs a `.pyc` instead of a source in two ways. From `__pycache__/<name>.<tag>[.opt-N].pyc`
beside `<name>.py`, when the pyc's tag is the interpreter's and its header says it belongs to
that source: the source's size (and mtime), the source's hash, or, for an unchecked-hash pyc,
nothing at all. And from `<name>.pyc` in place of a missing `<name>.py`. Either way the code that
runs is the bytecode's, so bytecode that could run is compiled from its source (by this Python)
and compared code object by code object; a pyc that matches is left out as what a build writes.

What is left out, with its reason: bytecode that matches (`bytecode-of-source`), and bytecode
Python never loads (`bytecode-unused`: no source beside `__pycache__`, a header this Python
rejects, a stale size or hash, a `.pyo`, or a `<name>.pyc` beside its `<name>.py`). What is an
integrity problem: bytecode that differs from its source (`bytecode-differs`), bytecode for
another Python, too large, or unreadable (`bytecode-unchecked`), and sourceless bytecode
(`bytecode-without-source`).

The pyc is unmarshalled in a child process (`python -I -S`, its memory capped): `marshal` is not
safe against crafted data, and a crash there must not end the audit, only mark that bytecode
unchecked.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable

#: Bytecode or source over this many bytes is not compiled or compared (`bytecode-unchecked`).
#: vLLM's largest Python file is 295 KB.
MAX_COMPARED_BYTES = 1 << 20
_HEADER_BYTES = 16
_FLAG_HASH_BASED = 0b01
_FLAG_CHECK_SOURCE = 0b10
# The child's memory cap: compiling a 1 MiB source takes a few hundred MiB.
_CHILD_MEMORY_BYTES = 4 << 30

# Reads one JSON request per line ({"source", "pyc": base64, "optimize"}), prints one JSON list
# of verdicts: "equal", "differs" (including a source that does not compile) or "unreadable".
_COMPARE = """
import base64, json, marshal, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
verdicts = []
for line in sys.stdin:
    request = json.loads(line)
    source, pyc = (base64.b64decode(request[k]) for k in ("source", "pyc"))
    try:
        loaded = marshal.loads(pyc)
    except Exception:
        verdicts.append("unreadable")
        continue
    try:
        compiled = compile(source, "<source>", "exec", dont_inherit=True,
                           optimize=request["optimize"])
    except Exception:
        verdicts.append("differs")
        continue
    verdicts.append("equal" if loaded == compiled else "differs")
print(json.dumps(verdicts))
"""


def is_bytecode(path: str) -> bool:
    return path.endswith((".pyc", ".pyo"))


def judge_bytecode(paths: list[str], content: Callable[[str], bytes | None]) -> dict[str, str]:
    """The verdict of each bytecode file of PATHS on one side, whose files CONTENT reads (None:
    absent, a link, or large): a `LEFT_OUT_REASONS` code (`bytecode-of-source`,
    `bytecode-unused`) or an integrity problem's code (`_snapshot.INTEGRITY_PROBLEMS`)."""
    verdicts: dict[str, str] = {}
    compared: list[tuple[str, bytes, bytes, int]] = []
    for path in paths:
        verdict, request = _judge(path, content)
        if verdict is not None:
            verdicts[path] = verdict
        elif request is not None:
            compared.append((path, *request))
    for (path, *_), outcome in zip(compared, _compare([c[1:] for c in compared]), strict=True):
        verdicts[path] = {
            "equal": "bytecode-of-source",
            "differs": "bytecode-differs",
        }.get(outcome, "bytecode-unchecked")
    return verdicts


def _judge(
    path: str, content: Callable[[str], bytes | None]
) -> tuple[str | None, tuple[bytes, bytes, int] | None]:
    """A verdict, or what to compare: (source, the pyc's code, optimization level)."""
    if path.endswith(".pyo"):
        return "bytecode-unused", None  # Python 3 loads no .pyo
    folder, _, name = path.rpartition("/")
    parent, _, cache = folder.rpartition("/")
    if cache != "__pycache__":
        beside = f"{folder}/{name[:-1]}" if folder else name[:-1]
        used = content(beside) is None  # a source beside it is imported instead
        return ("bytecode-without-source" if used else "bytecode-unused"), None
    module, _, rest = name.partition(".")
    tag, _, optimization = rest.removesuffix(".pyc").partition(".")
    source_path = f"{parent}/{module}.py" if parent else f"{module}.py"
    source, pyc = content(source_path), content(path)
    if source is None:
        return "bytecode-unused", None  # only a source's loader reads __pycache__
    if tag != sys.implementation.cache_tag or pyc is None:
        return "bytecode-unchecked", None
    if len(pyc) < _HEADER_BYTES or pyc[:4] != importlib.util.MAGIC_NUMBER:
        return "bytecode-unused", None  # Python compiles the source instead
    flags = int.from_bytes(pyc[4:8], "little")
    if flags & _FLAG_HASH_BASED:
        if flags & _FLAG_CHECK_SOURCE and pyc[8:16] != importlib.util.source_hash(source):
            return "bytecode-unused", None
    elif int.from_bytes(pyc[12:16], "little") != len(source) & 0xFFFFFFFF:
        return "bytecode-unused", None  # a timestamp pyc of another source size is stale
    if max(len(pyc), len(source)) > MAX_COMPARED_BYTES:
        return "bytecode-unchecked", None
    levels = {"": 0, "opt-1": 1, "opt-2": 2}
    if optimization not in levels:
        return "bytecode-unused", None  # no interpreter looks for that name
    return None, (source, pyc[_HEADER_BYTES:], levels[optimization])


def _compare(requests: list[tuple[bytes, bytes, int]]) -> list[str]:
    """Each (source, code, optimization)'s verdict from one child process; "unreadable" for all
    when the child dies."""
    if not requests:
        return []
    lines = "".join(
        json.dumps(
            {
                "source": base64.b64encode(source).decode(),
                "pyc": base64.b64encode(code).decode(),
                "optimize": level,
            }
        )
        + "\n"
        for source, code, level in requests
    )
    child = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _COMPARE.format(limit=_CHILD_MEMORY_BYTES)],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        verdicts = json.loads(child.stdout) if child.returncode == 0 else []
    except ValueError:
        verdicts = []
    if not isinstance(verdicts, list) or len(verdicts) != len(requests):
        return ["unreadable"] * len(requests)
    return [str(v) for v in verdicts]
