"""Argument checks and launch helpers shared by the kernel launchers."""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import InvalidInputError, KernelUnavailableError


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_runnable(name: str, tensor: torch.Tensor) -> None:
    """Kernels run on CUDA/ROCm tensors, or on CPU tensors under the interpreter."""
    if tensor.device.type == "cpu" and not interpreted():
        raise KernelUnavailableError(
            f"`{name}` is on the CPU but Triton's interpreter is off; set TRITON_INTERPRET=1 "
            "before importing kvquant, or pass CUDA tensors"
        )


def check_tensor(
    name: str,
    tensor: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...],
    shape: tuple[int | None, ...],
    device: torch.device,
) -> None:
    """Raise a one-line InvalidInputError unless ``tensor`` matches; None in shape is free."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidInputError(f"`{name}` is a {type(tensor).__name__}; expected a torch.Tensor")
    if tensor.dtype not in dtypes:
        raise InvalidInputError(f"`{name}` has dtype {tensor.dtype}; expected one of {dtypes}")
    sizes = tensor.shape
    matches = len(sizes) == len(shape)
    if matches:  # a plain loop: launchers run these checks on every call
        for got, want in zip(sizes, shape, strict=True):
            if want is not None and got != want:
                matches = False
                break
    if not matches:
        wanted = tuple("*" if s is None else s for s in shape)
        raise InvalidInputError(
            f"`{name}` has shape {tuple(tensor.shape)}; expected {wanted}".replace("'", "")
        )
    if tensor.device != device:
        raise InvalidInputError(f"`{name}` is on {tensor.device}; expected {device}")


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ---- Ahead-of-time build contract ----
#
# Each ops module has a pure ``aot_specs(...)`` that says exactly what its launcher compiles for a
# specialization; the launcher builds its launch from the same spec, so the two cannot drift.

TARGETS = ("cuda", "hip")
_TRITON_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel variant: what ``triton.compile(ASTSource(...), target, options)`` needs.

    Attributes:
        name: stable id, e.g. "decode_attention", "reduce_splits", "cache_write".
        kernel: the ``@triton.jit`` function.
        signature: every parameter, in order -> Triton type ("*bf16", "*i8", "i32", "i64", "fp32",
            ...), "constexpr" for constexpr parameters.
        constexprs: the value of every constexpr parameter.
        num_warps, num_stages: launch options.
        aligned: the runtime parameters the JIT sees as multiples of 16 on every launch (pointers
            to torch allocations, strides made of head and block sizes). An ahead-of-time build
            must pass them as ``tt.divisibility=16``, as the JIT does, or loads lose their width.
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, int | float | bool]
    num_warps: int
    num_stages: int
    aligned: tuple[str, ...] = ()

    @functools.cached_property
    def runtime_parameters(self) -> tuple[str, ...]:
        """The kernel's runtime parameters (all but its constexprs), in signature order."""
        return tuple(name for name, kind in self.signature.items() if kind != "constexpr")

    def arguments(self, **values: object) -> tuple[object, ...]:
        """``values``, one per runtime parameter by name, in signature order: the arguments
        `launch` and the launchers (`kernel_launcher`) take.

        Raises:
            TypeError: ``values`` lacks a runtime parameter or names one the kernel lacks.
        """
        params = self.runtime_parameters
        if len(values) == len(params):
            try:
                return tuple(map(values.__getitem__, params))
            except KeyError:
                pass
        missing = [name for name in params if name not in values]
        unknown = sorted(set(values) - set(params))
        raise TypeError(
            f"{self.name}: the launch's arguments are not the kernel's runtime parameters; "
            f"missing {missing}, unknown {unknown}"
        )


def pointer(dtype: torch.dtype) -> str:
    """Triton's signature type of a pointer to ``dtype``, e.g. ``*bf16``."""
    return "*" + _TRITON_TYPES[dtype]


def runtime_target(device: torch.device) -> str:
    """The target a launch on ``device`` compiles for: "cuda", "hip" or "interpreter"."""
    if interpreted() or device.type == "cpu":
        return "interpreter"
    return "hip" if torch.version.hip is not None else "cuda"


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise InvalidInputError(f"`target` is {target!r}; expected one of {TARGETS}")


# Runtime sizes that are multiples of 16 on every launch (SUPPORTED_HEAD_SIZES and
# SUPPORTED_BLOCK_SIZES): the JIT marks them so, which keeps masks over 16 dims constant and the
# loads 16 bytes wide. One compiled cache write serves every block size and the head sizes that pad
# alike (80, 96, 128), one attention kernel every block size (DESIGN.md, "Fewer compiled variants").
_SIZES_OF_16 = ("head_size", "block_size")


def page_shift(block_size: int) -> int:
    """log2 of a block size (a power of two): kernels split positions into page and offset by
    shifting, since a 64-bit division is a long routine on AMD GPUs."""
    return block_size.bit_length() - 1


def make_spec(
    name: str,
    kernel: Any,
    types: dict[str, str],
    constexprs: dict[str, int | float | bool],
    *,
    num_warps: int,
    num_stages: int,
    unaligned: tuple[str, ...] = (),
) -> KernelSpec:
    """Build a spec whose signature lists ``kernel``'s parameters in order; checks completeness.

    Every pointer, every ``stride_*`` parameter and the cache's ``head_size`` and ``block_size``
    (every supported one is a multiple of 16) count as aligned (see `KernelSpec.aligned`) except
    those named in ``unaligned``: strides whose value callers choose freely.

    Every other integer parameter must be in the kernel's ``do_not_specialize``. Triton's JIT
    otherwise compiles a separate variant for an integer equal to 1 (a constant) or divisible by
    16: variants the ahead-of-time build does not compile (so its resource report would not
    describe what runs) and that a server would compile mid-run the first time a batch shape
    produced such a value (one split, one tile per split, one token to write).
    """
    params = _parameters(kernel)
    signature = {name_: "constexpr" if const else types[name_] for name_, const in params}
    wanted = {name_ for name_, const in params if const}
    if set(constexprs) != wanted or set(types) != {n for n, c in params if not c}:
        raise AssertionError(f"{name}: spec does not cover the kernel's parameters exactly")
    aligned = tuple(
        name_
        for name_, kind in signature.items()
        if (kind.startswith("*") or name_.startswith("stride_") or name_ in _SIZES_OF_16)
        and name_ not in unaligned
    )
    integers = {n for n, kind in signature.items() if kind in ("i32", "i64") and n not in aligned}
    if integers != _not_specialized(kernel):
        raise AssertionError(
            f"{name}: do_not_specialize must name exactly the unaligned integer parameters "
            f"{sorted(integers)}"
        )
    return KernelSpec(name, kernel, signature, dict(constexprs), num_warps, num_stages, aligned)


def _parameters(kernel: Any) -> list[tuple[str, bool]]:
    """(name, whether constexpr) of each of ``kernel``'s parameters, in order."""
    python_fn = getattr(kernel, "fn", kernel)  # JITFunction and the interpreter's wrapper
    return [
        (p.name, "constexpr" in str(p.annotation))
        for p in inspect.signature(python_fn).parameters.values()
    ]


def runtime_parameters(kernel: Any) -> tuple[str, ...]:
    """``kernel``'s runtime parameters (all but its constexprs), in signature order: the names
    a spec's types (`make_spec`) are given for."""
    return tuple(name for name, const in _parameters(kernel) if not const)


def _not_specialized(kernel: Any) -> set[str]:
    """The parameters named in a kernel's do_not_specialize (JIT or interpreter wrapper)."""
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:  # the interpreter keeps triton.jit's keyword arguments
        names = getattr(kernel, "kwargs", {}).get("do_not_specialize") or ()
    return set(names)


def launch(spec: KernelSpec, grid: tuple[int, ...], arguments: tuple[object, ...]) -> None:
    """Launch ``spec.kernel`` through Triton's JIT with ``arguments`` (`KernelSpec.arguments`)
    and the spec's constexprs."""
    spec.kernel[grid](
        *arguments, **spec.constexprs, num_warps=spec.num_warps, num_stages=spec.num_stages
    )


# ---- Launching without the JIT's per-call work ----
#
# ``kernel[grid](...)`` binds every argument to the signature, specializes each (type, alignment,
# value 1, divisibility by 16), builds a cache key and looks the compiled variant up, on every
# call: 16 us of host time for the decode's two launches on this project's CPU machine, before
# the driver call. The variant a launcher compiles is fixed by its spec (`make_spec`), so it can
# be found once and launched through the compiled kernel's own launcher, which the JIT itself
# calls last: ``run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata,
# enter_hook, exit_hook, *every_parameter)`` in Triton 3.6 and 3.9, on CUDA and HIP.

_TORCH_TYPES = {name: dtype for dtype, name in _TRITON_TYPES.items()}
# What `CompiledLaunch` uses of a compiled kernel; a Triton without any of it launches via the JIT.
_COMPILED_KERNEL_API = ("_init_handles", "run", "function", "packed_metadata")
# Gate for the direct launch (tests force the JIT path to compare the two).
DIRECT_LAUNCH = True


def sample_arguments(spec: KernelSpec) -> list[object]:
    """Runtime arguments from which ``kernel.warmup`` compiles the variant a launch of ``spec``
    gets: every pointer 16-byte aligned (a torch dtype, which Triton's warmup stands in for with
    a tensor at address 0), every aligned integer divisible by 16 (not 1)."""
    samples: list[object] = []
    for name, kind in spec.signature.items():
        if kind == "constexpr":
            continue
        if kind.startswith("*"):
            samples.append(_TORCH_TYPES[kind[1:]])
        elif kind.startswith(("fp", "bf")):
            samples.append(1.0)
        else:  # the others are do_not_specialize (make_spec): any value compiles the same
            samples.append(16 if name in spec.aligned else 2)
    return samples


def _spec_key(spec: KernelSpec, device: torch.device) -> tuple[object, ...]:
    return (
        spec.name,
        spec.kernel,
        tuple(spec.signature.items()),
        tuple(sorted(spec.constexprs.items())),
        spec.num_warps,
        spec.num_stages,
        device.index,
    )


_compiled_kernels: dict[tuple[object, ...], Any] = {}


def compiled_kernel(spec: KernelSpec, device: torch.device) -> Any:
    """``spec``'s compiled kernel for a CUDA/HIP ``device``, its binary loaded (compiled once)."""
    key = _spec_key(spec, device)
    if key not in _compiled_kernels:
        with torch.cuda.device(device):
            kernel = spec.kernel.warmup(
                *sample_arguments(spec),
                grid=(1,),
                **spec.constexprs,
                num_warps=spec.num_warps,
                num_stages=spec.num_stages,
            )
            if hasattr(kernel, "result"):  # Triton's asynchronous compile mode hands a future
                kernel = kernel.result()
            # The binary is loaded (and the register count known) on the first launch, which
            # Triton 3.6 and 3.9 name `_init_handles`; load it now.
            kernel._init_handles()
        _compiled_kernels[key] = kernel
    return _compiled_kernels[key]


def aligned(addresses: int, sizes: int) -> bool:
    """Whether OR-ed pointer ``addresses`` and OR-ed aligned integer ``sizes`` (strides) are all
    multiples of 16, as `sample_arguments` compiled them."""
    return (addresses | sizes) & 15 == 0


class JitLaunch:
    """Launches ``spec`` through Triton's JIT (`launch`): pointers as tensors. Serves Triton's
    interpreter, arguments that are not aligned as the compiled variant assumes, and a Triton
    whose compiled kernels lack `_COMPILED_KERNEL_API`."""

    takes_addresses = False

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec

    def __call__(self, grid: tuple[int, ...], *args: object) -> None:
        launch(self.spec, grid, args)


class CompiledLaunch:
    """``spec`` compiled once for one device, launched through the compiled kernel's launcher.

    Arguments are the runtime ones in signature order (`KernelSpec.arguments`), pointers as
    addresses (ints, which both Triton versions' launchers take as they are); the constexpr
    values follow them (every kernel here declares its constexprs last, and the launcher takes
    every parameter). The caller checks `aligned` first: the variant assumes what
    `sample_arguments` says. The launch hooks and stream are the JIT's: the current stream of
    the current device, Triton's launch hooks when any is registered (a profiler's).
    """

    takes_addresses = True

    def __init__(self, spec: KernelSpec, device: torch.device) -> None:
        from triton import knobs
        from triton.runtime import driver

        kernel = compiled_kernel(spec, device)
        self._kernel = kernel
        self._launcher = kernel.run
        self._function = kernel.function
        self._metadata = kernel.packed_metadata
        self._constexprs = tuple(
            spec.constexprs[name] for name, kind in spec.signature.items() if kind == "constexpr"
        )
        self._runtime = knobs.runtime
        self._current_device = driver.active.get_current_device
        self._current_stream = driver.active.get_current_stream

    def __call__(self, grid: tuple[int, ...], *args: object) -> None:
        stream = self._current_stream(self._current_device())
        enter, leave = self._runtime.launch_enter_hook, self._runtime.launch_exit_hook
        if _no_hooks(enter) and _no_hooks(leave):
            enter = leave = metadata = None
        else:
            metadata = self._kernel.launch_metadata(grid, stream, *args, *self._constexprs)
        self._launcher(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            stream,
            self._function,
            self._metadata,
            metadata,
            enter,
            leave,
            *args,
            *self._constexprs,
        )


class BoundLaunch:
    """One launch of ``spec`` whose arguments are fixed once, but for ``varying`` ones given by
    position on each call: the per-layer launches of a plan made once per engine step.

    On a device whose launches go direct (`CompiledLaunch`) the fixed tensors become addresses
    once, and a call only puts its own values in place; tensors among them pass as addresses.
    A call whose addresses or aligned sizes are not multiples of 16 (or any call on a Triton that
    launches through the JIT, or under the interpreter) goes through `launch` with tensors.
    """

    def __init__(
        self,
        spec: KernelSpec,
        device: torch.device,
        grid: tuple[int, ...],
        fixed: dict[str, object],
        varying: tuple[str, ...],
    ) -> None:
        params = spec.runtime_parameters
        slots, checked, fixed_aligned = _bound_layout(spec, varying)
        if len(fixed) + len(varying) != len(params) or set(varying) & set(fixed):
            missing = sorted(set(params) - set(fixed) - set(varying))
            raise TypeError(f"{spec.name}: arguments neither fixed nor varying: {missing}")
        self.spec = spec
        self.grid = grid
        self._slots = slots
        self._checked = checked
        self._jit_args = [fixed.get(name) for name in params]
        self._launcher = kernel_launcher(spec, device)
        self._fixed_aligned = fixed_aligned
        # The arguments as the compiled kernel's launcher takes them, fixed tensors as addresses;
        # used while every fixed address and aligned size is a multiple of 16.
        self._addresses: list[object] | None = None
        if self._launcher.takes_addresses:
            self._addresses = [
                value.data_ptr() if isinstance(value, torch.Tensor) else value
                for value in self._jit_args
            ]
        self._direct_args = self._aligned_addresses()

    def _aligned_addresses(self) -> list[object] | None:
        addresses = self._addresses
        if addresses is None:
            return None
        check = 0
        for index in self._fixed_aligned:
            check |= addresses[index]  # type: ignore[operator]
        return addresses if check & 15 == 0 else None

    def rebound(self, grid: tuple[int, ...], values: dict[str, object]) -> BoundLaunch:
        """This launch with ``grid`` and other fixed ``values`` (tensors or numbers, by name):
        what changes from one engine step to the next, bound without redoing the rest."""
        index = _parameter_index(self.spec)
        bound = object.__new__(BoundLaunch)
        bound.__dict__.update(self.__dict__)
        bound.grid = grid
        bound._jit_args = self._jit_args.copy()
        addresses = None if self._addresses is None else self._addresses.copy()
        for name, value in values.items():
            slot = index[name]
            bound._jit_args[slot] = value
            if addresses is not None:
                addresses[slot] = value.data_ptr() if isinstance(value, torch.Tensor) else value
        bound._addresses = addresses
        bound._direct_args = bound._aligned_addresses()
        return bound

    def direct(self, *values: int | float) -> bool:
        """Launch with ``values`` given as addresses and numbers, if this launch goes direct and
        they are aligned as its compiled variant assumes; False (nothing launched) otherwise."""
        if self._direct_args is None:
            return False
        args = self._direct_args.copy()
        check = 0
        for slot, value, checked in zip(self._slots, values, self._checked, strict=True):
            args[slot] = value
            if checked:
                check |= value  # type: ignore[operator]
        if check & 15:
            return False
        self._launcher(self.grid, *args)
        return True

    def __call__(self, *values: object) -> None:
        if self._direct_args is not None:
            args = self._direct_args.copy()
            check = 0
            for slot, value, checked in zip(self._slots, values, self._checked, strict=True):
                if isinstance(value, torch.Tensor):
                    value = value.data_ptr()
                args[slot] = value
                if checked:
                    check |= value  # type: ignore[operator]
            if check & 15 == 0:
                self._launcher(self.grid, *args)
                return
        args = self._jit_args.copy()
        for slot, value in zip(self._slots, values, strict=True):
            args[slot] = value
        launch(self.spec, self.grid, tuple(args))


_bound_layouts: dict[tuple[int, tuple[str, ...]], tuple[KernelSpec, tuple[Any, ...]]] = {}


@functools.cache
def _parameter_index_by_names(names: tuple[str, ...]) -> dict[str, int]:
    return {name: index for index, name in enumerate(names)}


def _parameter_index(spec: KernelSpec) -> dict[str, int]:
    """Each runtime parameter's position among ``spec``'s."""
    return _parameter_index_by_names(spec.runtime_parameters)


def _bound_layout(
    spec: KernelSpec, varying: tuple[str, ...]
) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[int, ...]]:
    """Where ``varying`` go among ``spec``'s runtime parameters, which of them a direct launch
    checks against its 16-byte assumption, and which fixed ones it checks once (made once per
    spec and varying names: plans make their launches every engine step)."""
    entry = _bound_layouts.get((id(spec), varying))
    if entry is None or entry[0] is not spec:
        params = spec.runtime_parameters
        checked = {name for name in params if name in spec.aligned}
        checked |= {name for name in params if spec.signature[name].startswith("*")}
        layout = (
            tuple(params.index(name) for name in varying),
            tuple(name in checked for name in varying),
            tuple(i for i, name in enumerate(params) if name in checked and name not in varying),
        )
        entry = _bound_layouts[id(spec), varying] = (spec, layout)
    return entry[1]


def _no_hooks(hook: object) -> bool:
    """An unset launch hook, or an empty chain of them (Triton's default)."""
    return hook is None or getattr(hook, "calls", None) == []


# By the spec object (kept, so its id is not reused) and device: launchers look theirs up per call.
_launchers: dict[tuple[int, torch.device], tuple[KernelSpec, JitLaunch | CompiledLaunch]] = {}


def kernel_launcher(spec: KernelSpec, device: torch.device) -> JitLaunch | CompiledLaunch:
    """How launches of ``spec`` on ``device`` go: `CompiledLaunch` on CUDA/HIP devices (compiled
    here, once per spec and device), else (the interpreter, or a Triton without the compiled
    kernel's launcher) `JitLaunch`."""
    entry = _launchers.get((id(spec), device))
    if entry is not None and entry[0] is spec:
        return entry[1]
    launcher: JitLaunch | CompiledLaunch = JitLaunch(spec)
    if device.type == "cuda" and not interpreted() and DIRECT_LAUNCH:
        kernel = compiled_kernel(spec, device)
        if all(hasattr(kernel, name) for name in _COMPILED_KERNEL_API) and not (
            _constexprs_not_last(spec)
        ):
            launcher = CompiledLaunch(spec, device)
    _launchers[(id(spec), device)] = (spec, launcher)
    return launcher


def _constexprs_not_last(spec: KernelSpec) -> bool:
    kinds = [kind == "constexpr" for kind in spec.signature.values()]
    return kinds != sorted(kinds)


def clear_launch_caches() -> None:
    """Forget compiled kernels and launchers (after a sweep changed the launch constants)."""
    _compiled_kernels.clear()
    _launchers.clear()
    _bound_layouts.clear()


def resident_programs(spec: KernelSpec, device: torch.device) -> int:
    """How many programs of ``spec`` one SM (CU) of ``device`` holds at once, from its compiled
    resource use.

    CUDA: the driver's own count (`_cuda_resident_blocks`). HIP: the CDNA2 formula
    (``kvquant._occupancy``) on the kernel's VGPRs and LDS.
    """
    kernel = compiled_kernel(spec, device)
    shared = int(kernel.metadata.shared)
    if torch.version.hip is not None:
        from .._occupancy import cdna2_waves_per_simd

        waves = cdna2_waves_per_simd(
            vgprs=int(kernel.n_regs), agprs=0, sgprs=0, lds_bytes=shared, num_warps=spec.num_warps
        )
        return max(1, waves * 4 // spec.num_warps)
    return _cuda_resident_blocks(int(kernel.function), 32 * spec.num_warps, shared)


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _cuda_resident_blocks(function: int, threads: int, dynamic_shared: int) -> int:
    """Blocks of a loaded kernel one SM holds, as the driver schedules them
    (cuOccupancyMaxActiveBlocksPerMultiprocessor).

    Asked rather than derived: each of an SM's four schedulers owns a quarter of the register
    file, so whole warps must fit in a quarter. The 16-bit one-split decode (185 registers on the
    H200, Triton 3.6) fits twice per quarter, 8 programs per SM, where the whole file divided by
    its 6144 registers per warp says 10; a batch of 144 sequences at one split (1152 programs)
    then took 1.6x the time of 128 (DESIGN.md, "The split count").
    """
    blocks = ctypes.c_int()
    status = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(blocks),
        ctypes.c_void_p(function),
        ctypes.c_int(threads),
        ctypes.c_size_t(dynamic_shared),
    )
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: CUresult {status}")
    return max(1, blocks.value)
