"""The one argument of every paged-attention function besides its queries: a layer's K/V
pools and the batch's view of them (vLLM's per-layer ``kv_cache`` with its
``AttentionMetadata``), so the reference, the CPU, Metal and CUDA kernels, cascade attention
and the dispatcher share one signature."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from mlxpa.kernels.quant import QuantizedPool


class PagedKV(NamedTuple):
    """One layer's paged K/V as one attention call reads it.

    Attributes:
        key_cache: ``[num_blocks, kv_heads, block_size, head_dim]`` K pool of the layer, or a
            :class:`~mlxpa.kernels.quant.QuantizedPool` of that shape.
        value_cache: ``[num_blocks, kv_heads, block_size, v_dim]`` V pool (``v_dim`` may
            differ from ``head_dim``), or a quantized one.
        block_tables: ``[B, max_blocks]`` int32; row ``b`` lists the blocks holding its keys
            from position ``key_start[b]`` on (padding entries: any valid block).
        context_lens: ``[B]`` int32 tokens with K/V in the pool (computed + this step's).
        query_start: ``[B]`` int32 position of each row's query 0 (its
            ``num_computed_tokens``).
        scale: Softmax scale (usually ``head_dim ** -0.5``).
        sliding_window: Keys at or before ``query - sliding_window`` are masked (mlx-lm's
            rule; Gemma 3's local layers), or None for full attention.
        key_start: ``[B]`` int32 position of the first key in ``block_tables`` (a multiple
            of the block size), or None for 0: window layers gather only recent blocks.
        sinks: ``[q_heads]`` per-head sink logits (attention sinks, as gpt-oss: one more
            term ``exp(sink)`` in each softmax denominator, attending to nothing), or None.
    """

    key_cache: mx.array | QuantizedPool
    value_cache: mx.array | QuantizedPool
    block_tables: mx.array
    context_lens: mx.array
    query_start: mx.array
    scale: float
    sliding_window: int | None = None
    key_start: mx.array | None = None
    sinks: mx.array | None = None
