"""Shared fixtures. Kernel tests run on CUDA when present, else in Triton's CPU interpreter.

The interpreter must be chosen before Triton is imported, so it is set here, at collection.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def gen() -> torch.Generator:
    """Fresh random inputs every run (never zeros); the seed is printed on failure by pytest."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)


def require_cuda() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
