"""Triton chooses its interpreter when it is first imported. On a machine without CUDA every
kvbench test runs kvquant's kernels in the interpreter, whichever test happens to import them
first, so the choice is made here, before any test module loads."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
