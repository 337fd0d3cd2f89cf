"""Print the audit's speed against the issue's targets (run: python benchmarks/benchmark_audit.py).

1. `forkaudit.diff` of two directory trees of about 2,600 files / 27 MB each, against
   `git diff --no-index --binary` of the same trees; target: ratio <= 3.
2. `forkaudit.find_base` over 500 candidate commits of a 2,600-file repository; target: <= 30 s.
The trees are synthetic (seeded random Python-like text), so the run needs no network.
"""

import argparse
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import forkaudit

FILES = 2600
FILE_BYTES = 10_400  # 2,600 x 10.4 KB = 27 MB, vLLM's sdist tree size
MODIFIED, ADDED, DELETED, RENAMED = 150, 20, 10, 5
CANDIDATES = 500


def _text(rng: random.Random, size: int) -> bytes:
    words = ["def", "return", "self", "kv_cache", "block", "int8", "tensor", "=", "(", ")", "\n"]
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out).encode()


def _tree_paths() -> list[str]:
    return [f"vllm/pkg{i % 40:02d}/sub{i % 7}/module_{i:04d}.py" for i in range(FILES)]


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def _make_pair(root: Path, rng: random.Random) -> tuple[Path, Path]:
    upstream = {path: _text(rng, FILE_BYTES) for path in _tree_paths()}
    fork = dict(upstream)
    paths = list(upstream)
    rng.shuffle(paths)
    for path in paths[:MODIFIED]:
        fork[path] += b"\n# vendor patch\n"
    for path in paths[MODIFIED : MODIFIED + DELETED]:
        del fork[path]
    for path in paths[MODIFIED + DELETED : MODIFIED + DELETED + RENAMED]:
        fork[path.replace("module_", "renamed_")] = fork.pop(path)
    for i in range(ADDED):
        fork[f"vllm/vendor/added_{i}.py"] = _text(rng, FILE_BYTES)
    _write_tree(root / "upstream", upstream)
    _write_tree(root / "fork", fork)
    return root / "upstream", root / "fork"


def _best_of(runs: int, action: Callable[[], object]) -> float:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return min(timings)


def _git_diff_no_index(upstream: Path, fork: Path) -> None:
    subprocess.run(
        ["git", "diff", "--no-index", "--binary", str(upstream), str(fork)],
        stdout=subprocess.DEVNULL,
        check=False,  # exit 1 means "differences found"
    )


def _audit(upstream: Path, fork: Path) -> None:
    report = forkaudit.diff(f"dir:{fork}", f"dir:{upstream}")
    report.to_dict()
    report.patch()


def _make_history(root: Path, rng: random.Random) -> tuple[Path, Path]:
    """A repository of CANDIDATES commits (three files changed each), via git fast-import."""
    repo = root / "history"
    subprocess.run(["git", "init", "--quiet", "--bare", str(repo)], check=True)
    files = {path: _text(rng, FILE_BYTES) for path in _tree_paths()}
    stream = bytearray()

    def commit(number: int, changed: dict[str, bytes]) -> None:
        stream.extend(b"commit refs/heads/main\n")
        stream.extend(b"committer Bench <bench@example.com> %d +0000\n" % (1_700_000_000 + number))
        stream.extend(b"data 4\nc%03d\n" % number)
        for path, data in changed.items():
            stream.extend(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))

    commit(0, files)
    snapshots = {}
    for number in range(1, CANDIDATES):
        changed = {path: _text(rng, FILE_BYTES) for path in rng.sample(sorted(files), 3)}
        files.update(changed)
        commit(number, changed)
        if number == CANDIDATES * 2 // 3:
            snapshots["base"] = dict(files)
    subprocess.run(
        ["git", "--git-dir", str(repo), "fast-import", "--quiet"], input=bytes(stream), check=True
    )
    fork_files = snapshots["base"]
    for path in sorted(fork_files)[:5]:
        fork_files[path] += b"\n# vendor patch\n"
    _write_tree(root / "fork-of-history", fork_files)
    return repo, root / "fork-of-history"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    rng = random.Random(20261129)
    root = Path(tempfile.mkdtemp(prefix="forkaudit-bench-"))
    try:
        upstream, fork = _make_pair(root, rng)
        size = sum(p.stat().st_size for p in upstream.rglob("*") if p.is_file())
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
        print(f"pair: {FILES} files, {size / 1e6:.1f} MB per side")
        git_seconds = _best_of(args.runs, lambda: _git_diff_no_index(upstream, fork))
        audit_seconds = _best_of(args.runs, lambda: _audit(upstream, fork))
        ratio = audit_seconds / git_seconds
        print(f"git diff --no-index --binary: {git_seconds:.3f} s (best of {args.runs})")
        print(f"forkaudit diff dir: vs dir:  : {audit_seconds:.3f} s (best of {args.runs})")
        print(f"ratio: {ratio:.2f} (target <= 3)")

        repo, fork_of_history = _make_history(root, rng)
        start = time.perf_counter()
        result = forkaudit.find_base(f"dir:{fork_of_history}", repo, "main~499..main")
        seconds = time.perf_counter() - start
        print(
            f"find-base over {result.candidates} candidates: {seconds:.2f} s (target <= 30); "
            f"best differs in {result.best.files_changed} files"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
