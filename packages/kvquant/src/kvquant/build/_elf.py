"""Verification of compiled code objects with no GPU: a small ELF64 reader and MessagePack decoder.

An HSACO must be an AMDGPU ELF (e_machine 224, OS ABI AMDGPU_HSA) whose e_flags name the target's
machine, whose NT_AMDGPU_METADATA note decodes as MessagePack and lists the kernel, and whose symbol
table holds the kernel and its ``<name>.kd`` descriptor. A cubin must be an NVIDIA ELF (e_machine
190) for the target's SM with the kernel symbol. Layouts: the System V ABI, LLVM's AMDGPUUsage.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ._errors import ArtifactError

_EM_AMDGPU = 224
_EM_CUDA = 190
_ELFOSABI_AMDGPU_HSA = 64
# EI_ABIVERSION -> AMDGPU code object version (AMDGPUUsage, "ELF Header").
_AMDGPU_CODE_OBJECT_VERSIONS = {2: 4, 3: 5, 4: 6}
# EF_AMDGPU_MACH values of the processors we build for.
_AMDGPU_MACH = {"gfx90a": 0x03F}
_EF_AMDGPU_MACH_MASK = 0xFF
_NT_AMDGPU_METADATA = 32
# CUDA ELF: OS ABI 0x33 keeps the SM in e_flags bits 0-7; the newer ABI (0x41) in bits 8-15.
_ELFOSABI_CUDA_OLD = 0x33
_SHT_SYMTAB = 2
_SHT_NOTE = 7


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    data: bytes
    link: int


@dataclass(frozen=True)
class ElfFile:
    """The parts of an ELF64 little-endian file the checks need."""

    os_abi: int
    abi_version: int
    machine: int
    flags: int
    sections: tuple[_Section, ...]

    def symbols(self) -> dict[str, int]:
        """Symbol name -> index in the (first) symbol table."""
        found: dict[str, int] = {}
        for section in self.sections:
            if section.type != _SHT_SYMTAB:
                continue
            strings = self.sections[section.link].data
            for index, offset in enumerate(range(0, len(section.data) - 23, 24)):
                (name_at,) = struct.unpack_from("<I", section.data, offset)
                end = strings.find(b"\0", name_at)
                if name_at and end > name_at:
                    found.setdefault(strings[name_at:end].decode("utf-8", "replace"), index)
        return found

    def notes(self) -> list[tuple[bytes, int, bytes]]:
        """(name, type, descriptor) of every note in SHT_NOTE sections."""
        notes = []
        for section in self.sections:
            data, at = section.data, 0
            while section.type == _SHT_NOTE and at + 12 <= len(data):
                name_size, desc_size, note_type = struct.unpack_from("<III", data, at)
                at += 12
                name = data[at : at + name_size].rstrip(b"\0")
                at += (name_size + 3) & ~3
                notes.append((name, note_type, data[at : at + desc_size]))
                at += (desc_size + 3) & ~3
        return notes


def read_elf(blob: bytes, what: str) -> ElfFile:
    """Parse an ELF64 little-endian image; ArtifactError names ``what`` when it is not one."""
    if len(blob) < 64 or blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ArtifactError(f"{what}: not an ELF64 little-endian file")
    os_abi, abi_version = blob[7], blob[8]
    fields = struct.unpack_from("<HHIQQQIHHHHHH", blob, 16)
    machine, flags, sh_offset = fields[1], fields[6], fields[5]
    sh_entsize, sh_count, sh_strndx = fields[10], fields[11], fields[12]
    if sh_offset + sh_count * sh_entsize > len(blob) or sh_strndx >= max(sh_count, 1):
        raise ArtifactError(f"{what}: section headers lie outside the file")
    raw = []
    for index in range(sh_count):
        name, kind, _, _, offset, size, link, _, _, _ = struct.unpack_from(
            "<IIQQQQIIQQ", blob, sh_offset + index * sh_entsize
        )
        data = b"" if kind == 8 else blob[offset : offset + size]  # 8 = SHT_NOBITS
        raw.append((name, kind, data, link))
    names = raw[sh_strndx][2]
    sections = tuple(
        _Section(names[n : names.find(b"\0", n)].decode("utf-8", "replace"), k, d, lk)
        for n, k, d, lk in raw
    )
    return ElfFile(os_abi, abi_version, machine, flags, sections)


def unpack_msgpack(data: bytes) -> Any:
    """Decode one MessagePack value (the subset the AMDGPU metadata uses, plus bin)."""
    value, end = _unpack(data, 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} trailing bytes after the MessagePack value")
    return value


def _unpack(data: bytes, at: int) -> tuple[Any, int]:
    tag = data[at]
    at += 1
    if tag <= 0x7F:
        return tag, at
    if tag >= 0xE0:
        return tag - 0x100, at
    if 0x80 <= tag <= 0x8F:
        return _unpack_map(data, at, tag & 0x0F)
    if 0x90 <= tag <= 0x9F:
        return _unpack_array(data, at, tag & 0x0F)
    if 0xA0 <= tag <= 0xBF:
        return data[at : at + (tag & 0x1F)].decode(), at + (tag & 0x1F)
    simple = {0xC0: None, 0xC2: False, 0xC3: True}
    if tag in simple:
        return simple[tag], at
    numbers = {
        0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
        0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
    }  # fmt: skip
    if tag in numbers:
        (number,) = struct.unpack_from(numbers[tag], data, at)
        return number, at + struct.calcsize(numbers[tag])
    lengths = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}
    if tag in lengths:
        (size,) = struct.unpack_from(lengths[tag], data, at)
        at += struct.calcsize(lengths[tag])
        chunk = data[at : at + size]
        return (chunk.decode() if tag >= 0xD9 else chunk), at + size
    if tag in (0xDC, 0xDD, 0xDE, 0xDF):
        fmt = ">H" if tag in (0xDC, 0xDE) else ">I"
        (count,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return _unpack_array(data, at, count) if tag <= 0xDD else _unpack_map(data, at, count)
    raise ValueError(f"MessagePack tag 0x{tag:02x} at byte {at - 1} is not supported")


def _unpack_array(data: bytes, at: int, count: int) -> tuple[list[Any], int]:
    items = []
    for _ in range(count):
        item, at = _unpack(data, at)
        items.append(item)
    return items, at


def _unpack_map(data: bytes, at: int, count: int) -> tuple[dict[Any, Any], int]:
    mapping = {}
    for _ in range(count):
        key, at = _unpack(data, at)
        mapping[key], at = _unpack(data, at)
    return mapping, at


def verify_hsaco(blob: bytes, *, arch: str, kernel: str) -> dict[str, Any]:
    """Check an HSACO for ``arch``; return its code object version and the kernel's metadata.

    Raises ArtifactError naming the first check that fails.
    """
    what = f"HSACO of {kernel}"
    elf = read_elf(blob, what)
    if elf.machine != _EM_AMDGPU or elf.os_abi != _ELFOSABI_AMDGPU_HSA:
        raise ArtifactError(
            f"{what}: e_machine {elf.machine}, OS ABI {elf.os_abi}; expected AMDGPU "
            f"({_EM_AMDGPU}, {_ELFOSABI_AMDGPU_HSA})"
        )
    if arch not in _AMDGPU_MACH:
        raise ArtifactError(f"{what}: no EF_AMDGPU_MACH value known for {arch!r}")
    mach = elf.flags & _EF_AMDGPU_MACH_MASK
    if mach != _AMDGPU_MACH[arch]:
        raise ArtifactError(
            f"{what}: e_flags machine 0x{mach:03x}; expected 0x{_AMDGPU_MACH[arch]:03x} ({arch})"
        )
    version = _AMDGPU_CODE_OBJECT_VERSIONS.get(elf.abi_version)
    if version is None:
        raise ArtifactError(f"{what}: ABI version {elf.abi_version} is not code object v4-v6")
    notes = [
        desc for name, kind, desc in elf.notes() if (name, kind) == (b"AMDGPU", _NT_AMDGPU_METADATA)
    ]
    if len(notes) != 1:
        raise ArtifactError(f"{what}: {len(notes)} NT_AMDGPU_METADATA notes; expected 1")
    try:
        metadata = unpack_msgpack(notes[0])
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as error:
        raise ArtifactError(f"{what}: metadata note does not parse: {error}") from None
    kernels = {k.get(".name"): k for k in metadata.get("amdhsa.kernels", [])}
    if kernel not in kernels:
        raise ArtifactError(f"{what}: metadata lists {sorted(kernels)}; expected {kernel!r}")
    symbols = elf.symbols()
    missing = [s for s in (kernel, f"{kernel}.kd") if s not in symbols]
    if missing:
        raise ArtifactError(f"{what}: symbols {missing} missing from the symbol table")
    if kernels[kernel].get(".symbol") != f"{kernel}.kd":
        raise ArtifactError(f"{what}: metadata .symbol is {kernels[kernel].get('.symbol')!r}")
    return {"code_object_version": version, "kernel_metadata": kernels[kernel]}


def _nv_info(elf: ElfFile, symbol_index: int) -> dict[int, int]:
    """EIATTR attribute -> value for ``symbol_index`` from ``.nv.info``'s (symbol, value) records.

    Records are (format u8, attribute u8, size u16, payload); format 4 (EIFMT_SVAL) carries a
    payload, the others none.
    """
    found: dict[int, int] = {}
    for section in elf.sections:
        data, at = section.data, 0
        while section.name == ".nv.info" and at + 4 <= len(data):
            fmt, attribute, size = struct.unpack_from("<BBH", data, at)
            at += 4
            if fmt != 4:
                continue
            if size == 8:
                index, value = struct.unpack_from("<II", data, at)
                if index == symbol_index:
                    found[attribute] = value
            at += size
    return found


_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11


def verify_cubin(blob: bytes, *, sm: int, kernel: str) -> dict[str, Any]:
    """Check a cubin for ``sm``; return the kernel's registers per thread and stack frame bytes.

    Both come from the ``.nv.info`` attributes EIATTR_REGCOUNT and EIATTR_FRAME_SIZE (per-thread
    local memory, where spills go). Raises ArtifactError naming the first check that fails.
    """
    what = f"cubin of {kernel}"
    elf = read_elf(blob, what)
    if elf.machine != _EM_CUDA:
        raise ArtifactError(f"{what}: e_machine {elf.machine}; expected NVIDIA CUDA ({_EM_CUDA})")
    shift = 0 if elf.os_abi == _ELFOSABI_CUDA_OLD else 8
    found = (elf.flags >> shift) & 0xFF
    if found != sm:
        raise ArtifactError(f"{what}: e_flags say sm_{found}; expected sm_{sm}")
    symbols = elf.symbols()
    if kernel not in symbols:
        raise ArtifactError(f"{what}: symbol {kernel!r} missing from the symbol table")
    if not any(s.name == f".text.{kernel}" for s in elf.sections):
        raise ArtifactError(f"{what}: no .text.{kernel} section")
    info = _nv_info(elf, symbols[kernel])
    if _EIATTR_REGCOUNT not in info:
        raise ArtifactError(f"{what}: .nv.info has no register count for the kernel")
    return {"registers": info[_EIATTR_REGCOUNT], "scratch_bytes": info.get(_EIATTR_FRAME_SIZE, 0)}
