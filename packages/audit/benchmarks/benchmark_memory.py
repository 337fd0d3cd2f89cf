"""Print the audit's peak memory on a tree holding one 200 MB file (run: python
benchmarks/benchmark_memory.py); target: <= 1 GiB for a 200 MB text file.

Each case builds two `dir:` trees of a few small files plus one big file, runs `forkaudit diff`
with every output (JSON, Markdown, patch) in a fresh interpreter, and prints two peaks: the
interpreter's own (its VmHWM, exact) and the largest sum of resident memory over it and the
git processes it runs (read from /proc every 10 ms, so a shorter spike can be missed). VmHWM,
not `getrusage`: a process started from this one, which held the big files while writing
them, would inherit this one's high-water mark in `ru_maxrss`.

Cases: a 200 MB text file (about 3.3 million lines) that only the fork has, the same file in
both trees with one line in 1,000 changed, a 200 MB binary file (seeded random bytes, a few
changed), and a changed text file of exactly forkaudit's large-file size, the largest that is
still diffed line by line: the worst case of the diffed path. Last, a wheel of under 100 KB
holding two Python files just under the large-file size: diffed, but over the parsing budget,
so not parsed.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from forkaudit._snapshot import LARGE_FILE_BYTES

MB = 1_000_000
MIB = 1 << 20
TARGET_MIB = 1024

SAMPLE_SECONDS = 0.01

# Runs forkaudit's CLI in a fresh interpreter and writes its exit code and its own peak RSS
# (VmHWM, in KiB) to the file named by the first argument.
_RUNNER = """\
import json, sys
from pathlib import Path
from forkaudit.__main__ import main
code = main(sys.argv[2:])
status = Path("/proc/self/status").read_text().splitlines()
peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "self_kib": peak}, out)
"""


def _text(size: int, rng: random.Random) -> bytearray:
    """SIZE bytes of numbered lines of Python-like words."""
    words = [b"def", b"return", b"self", b"kv_cache", b"block", b"tensor", b"scale", b"int8"]
    phrases = [b" ".join(rng.choice(words) for _ in range(6)) for _ in range(997)]
    out = bytearray()
    number = 0
    while len(out) < size:
        out += b"%09d %s\n" % (number, phrases[number % len(phrases)])
        number += 1
    del out[size:]
    return out


def _text_fork(upstream: bytearray) -> bytearray:
    """One line in 1,000 changed (those numbered by a multiple of 1,000), the size kept."""
    return bytearray(upstream.replace(b"000 ", b"000:"))


def _binary(size: int, rng: random.Random) -> bytearray:
    return bytearray(rng.randbytes(size))


def _binary_fork(upstream: bytearray) -> bytearray:
    fork = bytearray(upstream)
    for position in range(0, len(fork), 10 * MB):
        fork[position] ^= 0xFF
    return fork


def _write_pair(root: Path, name: str, upstream: bytes | None, fork: bytes) -> tuple[Path, Path]:
    """Two trees of 20 small modules (three patched in the fork) plus vllm/NAME; an upstream of
    None leaves the big file out of the upstream tree."""
    for side, data in (("upstream", upstream), ("fork", fork)):
        tree = root / side
        (tree / "vllm").mkdir(parents=True)
        for i in range(20):
            module = f"def helper_{i}(x):\n    return x + {i}\n"
            if side == "fork" and i < 3:
                module += "# vendor patch\n"
            (tree / "vllm" / f"module_{i}.py").write_text(module)
        if data is not None:
            (tree / "vllm" / name).write_bytes(data)
    return root / "upstream", root / "fork"


def _tree_rss_kib(pid: int) -> int:
    """The resident memory of PID and all its descendants, in KiB (0 once it has exited)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:  # exited between two reads
            continue
        total += next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")),
            0,
        )
        pending += [int(child) for child in children]
    return total


def _measure(upstream: str, fork: str, out: Path) -> tuple[float, int, int]:
    """Run the audit of the SPECs; return its seconds, its own peak RSS and the sampled tree
    peak, in KiB."""
    peaks_file = out / "peaks.json"
    argv = [
        *["diff", "--fork", fork, "--upstream", upstream],
        *["--json", str(out / "a.json"), "--markdown", str(out / "a.md")],
        *["--patch", str(out / "a.patch")],
    ]
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(peaks_file), *argv], stdout=subprocess.DEVNULL
    )
    tree_peak = 0
    while process.poll() is None:
        tree_peak = max(tree_peak, _tree_rss_kib(process.pid))
        time.sleep(SAMPLE_SECONDS)
    seconds = time.perf_counter() - start
    peaks = json.loads(peaks_file.read_text())
    if process.returncode != 0 or peaks["code"] != 0:
        msg = f"forkaudit exited {process.returncode}, main returned {peaks['code']}"
        raise SystemExit(msg)
    return seconds, peaks["self_kib"], tree_peak


def _case(
    root: Path,
    label: str,
    name: str,
    size: int,
    make: Callable[[int, random.Random], bytearray],
    change: Callable[[bytearray], bytearray] | None,
    *,
    target: bool,
) -> None:
    """Measure one case; CHANGE None means the file is only in the fork."""
    case_root = root / name
    case_root.mkdir()
    data = make(size, random.Random(20261201))
    upstream, fork = (
        _write_pair(case_root, name, None, data)
        if change is None
        else _write_pair(case_root, name, data, change(data))
    )
    del data
    seconds, self_kib, tree_kib = _measure(f"dir:{upstream}", f"dir:{fork}", case_root)
    document = json.loads((case_root / "a.json").read_text())
    big = next(f for f in document["files"] if f["path"] == f"vllm/{name}")
    if big.get("large"):
        shown = "large, compared by blob id"
    elif big["binary"]:
        shown = "diffed as binary"
    else:
        shown = f"diffed, +{big['lines_added']}/-{big['lines_removed']}"
    patch_mb = (case_root / "a.patch").stat().st_size / MB
    goal = f" (target <= {TARGET_MIB} MiB)" if target else ""
    print(
        f"{label}: {size / MB:.1f} MB, {shown}, patch {patch_mb:.1f} MB; {seconds:.1f} s; "
        f"peak RSS forkaudit {self_kib / 1024:.0f} MiB, with git {tree_kib / 1024:.0f} MiB{goal}"
    )
    shutil.rmtree(case_root)


def _python_in_a_wheel(root: Path) -> None:
    """Two Python files just under the large-file size, packed into a wheel of under 100 KB."""
    case_root = root / "wheel"
    (case_root / "upstream" / "vllm").mkdir(parents=True)
    (case_root / "upstream" / "vllm" / "envs.py").write_text("x = 1\n")
    line = b"VLLM_ATTENTION_BACKEND = 'HYGON'\n"
    source = line * ((LARGE_FILE_BYTES - 1) // len(line))
    wheel = case_root / "vllm-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("vllm/envs.py", source)
        archive.writestr("vllm/attention/huge.py", source)
    seconds, self_kib, tree_kib = _measure(
        f"dir:{case_root / 'upstream'}", f"wheel:{wheel}", case_root
    )
    document = json.loads((case_root / "a.json").read_text())
    print(
        f"wheel of {wheel.stat().st_size / 1000:.0f} KB, two {len(source) / MIB:.1f} MiB Python "
        f"files, not parsed: {document['semantic']['large_files']}; {seconds:.1f} s; "
        f"peak RSS forkaudit {self_kib / 1024:.0f} MiB, with git {tree_kib / 1024:.0f} MiB"
    )
    shutil.rmtree(case_root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200, help="size of the big file, in MB")
    args = parser.parse_args()
    size = args.size_mb * MB
    root = Path(tempfile.mkdtemp(prefix="forkaudit-memory-"))
    print(f"machine: {os.cpu_count()} cpus; large-file size {LARGE_FILE_BYTES / MIB:g} MiB")
    try:
        _case(root, "text file added", "added.txt", size, _text, None, target=True)
        _case(root, "text file changed", "changed.txt", size, _text, _text_fork, target=True)
        _case(root, "binary file changed", "changed.bin", size, _binary, _binary_fork, target=False)
        edge = LARGE_FILE_BYTES
        _case(root, "text file at the large-file size", "edge.txt", edge, _text, _text_fork,
              target=False)  # fmt: skip
        _python_in_a_wheel(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
