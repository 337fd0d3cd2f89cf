"""The targets ``kvquant build`` compiles for, by their CLI names."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import UnknownTargetError


@dataclass(frozen=True)
class Target:
    """A CLI target name and what Triton and the checks need to know about it."""

    name: str
    backend: str  # Triton's GPUTarget backend: "hip" or "cuda"
    arch: str | int  # GPUTarget arch: "gfx90a" or the SM number
    warp_size: int
    binary: str  # the key of the code object in CompiledKernel.asm, also the file suffix
    listing: str  # the key of the assembly listing kept beside it

    @property
    def spec_target(self) -> str:
        """The ``target`` argument of the kernels' ``aot_specs``."""
        return self.backend


# The AOT target of the team's accelerator (CDNA2, wave64, no FP8) is gfx90a.
GFX90A = Target("gfx90a", "hip", "gfx90a", 64, "hsaco", "amdgcn")
SM90 = Target("sm90", "cuda", 90, 32, "cubin", "ptx")
TARGETS = {target.name: target for target in (GFX90A, SM90)}


def resolve_targets(names: list[str]) -> list[Target]:
    """Targets by name, in order, without repeats; UnknownTargetError lists the supported ones."""
    resolved: list[Target] = []
    for name in names:
        if name not in TARGETS:
            raise UnknownTargetError(f"unknown target {name!r}; supported: {', '.join(TARGETS)}")
        if TARGETS[name] not in resolved:
            resolved.append(TARGETS[name])
    if not resolved:
        raise UnknownTargetError(f"no target given; supported: {', '.join(TARGETS)}")
    return resolved
