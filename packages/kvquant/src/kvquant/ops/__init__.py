"""Triton kernels, one family per module: each holds its kernels and then their launchers."""
