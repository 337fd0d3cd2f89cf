"""Argument checks and launch helpers shared by the kernel launchers."""

from __future__ import annotations

import os

import torch

from .._errors import InvalidInputError, KernelUnavailableError

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)


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
    if tensor.dim() != len(shape) or any(
        want is not None and got != want for got, want in zip(tensor.shape, shape, strict=True)
    ):
        wanted = tuple("*" if s is None else s for s in shape)
        raise InvalidInputError(
            f"`{name}` has shape {tuple(tensor.shape)}; expected {wanted}".replace("'", "")
        )
    if tensor.device != device:
        raise InvalidInputError(f"`{name}` is on {tensor.device}; expected {device}")


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
