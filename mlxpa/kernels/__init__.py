"""Paged-attention kernels: the MLX-ops reference (the spec) and backend dispatch."""

from __future__ import annotations

from mlxpa.kernels.reference import paged_attention

__all__ = ["paged_attention"]
