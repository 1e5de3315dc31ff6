"""Where MLX computes by default: the one test for "the default device is the CPU"."""

from __future__ import annotations

import mlx.core as mx


def on_cpu() -> bool:
    """Whether MLX's default device is the CPU (the CPU kernels and fused ops apply, and half
    precision is computed in float32, where MLX's CPU matmuls are about 3x faster)."""
    return mx.default_device() == mx.cpu
