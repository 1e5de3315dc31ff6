"""Paged attention in MLX ops: the specification every native kernel is checked against.

Algorithm: PagedAttention (Kwon et al., "Efficient Memory Management for Large Language
Model Serving with PagedAttention", SOSP 2023; vLLM). Each sequence's K/V live in fixed-size
blocks of a shared pool; a block table maps the sequence's logical blocks to pool blocks. This
path gathers a sequence's blocks into a contiguous ``[B, kv_heads, S, D]`` view with one index
op and calls ``mx.fast.scaled_dot_product_attention`` with a boolean mask built from context
lengths, query positions and the sliding window. On the CPU it computes in float32 (MLX's CPU
half-precision matmul is slower and less exact). A quantized pool
(:class:`~mlxpa.kernels.quant.QuantizedPool`) is gathered packed and dequantized after the
gather (dequantize-then-attend, the specification of every quantized kernel).

Cascade attention's specification is :mod:`mlxpa.kernels.cascade_reference`.
"""

from __future__ import annotations

import mlx.core as mx

from mlxpa.kernels.device import on_cpu
from mlxpa.kernels.paged_kv import PagedKV
from mlxpa.kernels.quant import QuantizedPool, dense


def _gather(cache: mx.array, block_tables: mx.array) -> mx.array:
    _, kv_heads, block_size, width = cache.shape
    b, nb = block_tables.shape
    heads = mx.arange(kv_heads)
    out = cache[block_tables[:, None, :], heads[None, :, None]]
    return out.reshape(b, kv_heads, nb * block_size, width)


def gather_kv(cache: mx.array | QuantizedPool, block_tables: mx.array,
              ) -> mx.array | QuantizedPool:
    """Gather blocks of one layer's K or V pool into contiguous per-sequence tensors.

    Args:
        cache: ``[num_blocks, kv_heads, block_size, head_dim]`` pool, or a quantized pool of
            that shape (each of its arrays is gathered; nothing is dequantized).
        block_tables: ``[B, max_blocks]`` int32 pool block ids (padding entries may be 0).

    Returns:
        ``[B, kv_heads, max_blocks * block_size, head_dim]``, same dtype as ``cache`` (a
        :class:`QuantizedPool` of that shape for a quantized pool).
    """
    if isinstance(cache, QuantizedPool):
        return cache.map(lambda a: _gather(a, block_tables))
    return _gather(cache, block_tables)


def attention_mask(query_start: mx.array, num_queries: int, context_lens: mx.array,
                   num_keys: int, key_start: mx.array | None = None,
                   sliding_window: int | None = None) -> mx.array:
    """Boolean ``[B, 1, L, S]`` mask: query ``i`` of row ``b`` (position
    ``query_start[b] + i``) sees key ``j`` (position ``key_start[b] + j``) when the key is
    causal, inside the context (``< context_lens[b]``) and inside the window (mlx-lm's rule:
    the last ``sliding_window`` positions, the query's own included)."""
    qpos = query_start[:, None] + mx.arange(num_queries)[None, :]          # [B, L]
    kpos = mx.arange(num_keys)[None, :]                                    # [1, S]
    if key_start is not None:
        kpos = kpos + key_start[:, None]
    kpos = kpos[:, None, :]                                                # [B|1, 1, S]
    mask = (kpos <= qpos[:, :, None]) & (kpos < context_lens[:, None, None])
    if sliding_window is not None:
        mask = mask & (kpos > qpos[:, :, None] - sliding_window)
    return mask[:, None]


def gathered_attention(q: mx.array, k: mx.array, v: mx.array, context_lens: mx.array,
                       query_start: mx.array, *, scale: float,
                       sliding_window: int | None = None, score_bias: mx.array | None = None,
                       sinks: mx.array | None = None) -> mx.array:
    """Attention over K/V a layer derived from its gathered cache (latent attention, MLA, as
    mlx-lm writes it for DeepSeek V3: ``k``/``v`` are computed from the cached latent, and the
    RoPE part of the scores arrives as an additive ``score_bias``).

    Args:
        q: ``[B, q_heads, L, d]`` queries (right-padded rows, as :func:`paged_attention`).
        k: ``[B, kv_heads, S, d]`` keys for key positions ``0..S-1`` (beyond
            ``context_lens[b]``: anything finite).
        v: ``[B, kv_heads, S, v_dim]`` values.
        context_lens, query_start, sliding_window: As :class:`PagedKV`.
        scale: Softmax scale applied to ``q @ k^T``.
        score_bias: ``[B, q_heads, L, S]`` float terms added to the scaled scores before the
            softmax (mlx-lm passes them as an additive ``mask``), or None.
        sinks: ``[q_heads]`` per-head sink logits, or None.

    Returns:
        ``[B, q_heads, L, v_dim]`` in ``q.dtype``.
    """
    allowed = attention_mask(query_start, q.shape[2], context_lens, k.shape[2], None,
                             sliding_window)
    dtype = q.dtype
    if on_cpu() and dtype != mx.float32:
        q, k, v = q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32)
    mask = allowed
    if score_bias is not None:
        low = mx.array(mx.finfo(mx.float32).min, q.dtype)
        mask = mx.where(allowed, score_bias.astype(q.dtype), low)
    if sinks is not None:
        sinks = sinks.astype(q.dtype)
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    return out.astype(dtype)


def paged_attention(q: mx.array, kv: PagedKV) -> mx.array:
    """Attention of new queries over K/V held in a paged pool (prefill chunks and decode).

    The new tokens' K/V must already be written to the pool (the caller writes, then reads).

    Args:
        q: ``[B, q_heads, L, head_dim]`` queries (RoPE applied); rows shorter than ``L`` are
            right-padded and their padded outputs are garbage but finite.
        kv: The layer's pools and the batch's tables (:class:`PagedKV`); a quantized pool is
            gathered, then dequantized.

    Returns:
        ``[B, q_heads, L, v_dim]`` in ``q.dtype``.
    """
    k = dense(gather_kv(kv.key_cache, kv.block_tables))
    v = dense(gather_kv(kv.value_cache, kv.block_tables))
    mask = attention_mask(kv.query_start, q.shape[2], kv.context_lens, k.shape[2],
                          kv.key_start, kv.sliding_window)
    dtype = q.dtype
    if on_cpu() and dtype != mx.float32:
        q, k, v = q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32)
    sinks = None if kv.sinks is None else kv.sinks.astype(q.dtype)
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=kv.scale, mask=mask, sinks=sinks)
    return out.astype(dtype)
