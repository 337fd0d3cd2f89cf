"""Cold and warm build time of a build matrix (default: kvquant's, for gfx90a).

Cold: an empty kvquant build cache and an empty Triton cache, so every cell really compiles.
Warm: the same build again (a new output directory, the cache now full). Run without
TRITON_INTERPRET:
  python benchmarks/benchmark_build.py [--target sm90] [--matrix FILE] [--jobs N] [--keep]
The caches and build outputs (100-200 MB) go to a temporary directory, removed at the end
unless --keep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", action="append", default=None)
    parser.add_argument("--matrix", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the caches and build outputs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvquant-build-bench-"))
    try:
        run(args, work)
    finally:
        if args.keep:
            print(f"work dir:    {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    os.environ["TRITON_CACHE_DIR"] = str(work / "triton")  # read by Triton at compile time
    from kvquant.build import build

    targets = args.target or ["gfx90a"]
    cache = work / "cache"
    cold = build(targets, args.matrix, out=work / "cold", cache_dir=cache, jobs=args.jobs)
    warm = build(targets, args.matrix, out=work / "warm", cache_dir=cache, jobs=args.jobs)
    started = time.perf_counter()
    command = [sys.executable, "-m", "kvquant", "build", "--out", str(work / "cli")]
    command += [a for t in targets for a in ("--target", t)]
    command += ["--matrix", str(args.matrix)] if args.matrix else []
    subprocess.run(command, env={**os.environ, "KVQUANT_BUILD_CACHE": str(cache)},
                   capture_output=True, check=False)  # fmt: skip
    cli_s = time.perf_counter() - started

    by_kernel: dict[str, list[float]] = defaultdict(list)
    for cell in cold.cells:
        if cell["status"] == "ok":
            by_kernel[cell["kernel"]].append(cell["compile_s"])
    print(f"targets {targets}, {len(cold.cells)} cells, {len(cold.failures)} failed, "
          f"jobs {args.jobs or os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for kernel, seconds in sorted(by_kernel.items()):
        print(f"  {kernel:<18} {len(seconds):>4} cells, compile {statistics.mean(seconds):5.2f} s "
              f"mean, {sum(seconds):7.1f} s total (one core)")  # fmt: skip
    print(f"cold build:  {cold.elapsed_s:7.2f} s  (target <= 60 s)")
    print(f"warm build:  {warm.elapsed_s:7.2f} s  (target <= 2 s; {warm.cached} cached)")
    print(f"warm CLI:    {cli_s:7.2f} s  (a fresh `python -m kvquant build`, imports included)")


if __name__ == "__main__":
    main()
