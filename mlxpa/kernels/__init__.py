"""Paged-attention kernels: the MLX-ops reference (the spec) and backend dispatch."""

from __future__ import annotations

import mlx.core as mx

from mlxpa.kernels import reference


def paged_attention(q: mx.array, key_cache: mx.array, value_cache: mx.array,
                    block_tables: mx.array, context_lens: mx.array, query_start: mx.array,
                    *, scale: float, sliding_window: int | None = None,
                    key_start: mx.array | None = None, kernel: str = "auto") -> mx.array:
    """Paged attention through the chosen backend (see ``reference.paged_attention`` for
    shapes). Only the reference exists so far; every ``kernel`` value runs it."""
    return reference.paged_attention(q, key_cache, value_cache, block_tables, context_lens,
                                     query_start, scale=scale, sliding_window=sliding_window,
                                     key_start=key_start)


__all__ = ["paged_attention"]
