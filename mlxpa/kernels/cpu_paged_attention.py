"""Paged attention for MLX's CPU back end: decode in MLX ops without copying the context,
prefill chunks over long contexts in numpy.

The reference gathers each row's blocks into a contiguous ``[B, kv_heads, S, D]`` copy before
attending, and in a decode step that copy is most of the cost. Here decode reads the pool in
place through ``mx.gather_mm``, a batched matmul whose right operand is picked by index: one
``[q_per_kv, D] @ [D, block_size]`` product per (row, KV head, block) gives the scores, a
base-2 softmax over the row's keys, and one ``[q_per_kv, block_size] @ [block_size, D]``
product per (row, KV head, block) summed over blocks gives the output (PagedAttention's per-
block loop, Kwon et al., SOSP 2023, as batched matmuls). Prefill chunks keep the gather (its
copy is small next to the chunk's matmuls) and attend, over long contexts in numpy
(:mod:`mlxpa.kernels.cpu_prefill_attention`: MLX's CPU exponentials are scalar, numpy's
vectorised), over short ones in MLX ops on the two CPU streams, their queries cut into tiles of
at most ``query_tile`` rows, each tile over only the key range some row of the batch can see
from it (:func:`key_ranges`: causal above, sliding window below), FlashAttention's block
skipping (Dao et al. 2022) at tile granularity.

The softmax is ``2^(s log2 e - max) / sum`` with the scale and ``log2 e`` folded into the
queries (FlashAttention-2's ``exp2``): on MLX's CPU back end ``power(2, x)`` costs about half
of ``exp``.

Quantized pools (:class:`~mlxpa.kernels.quant.QuantizedPool`): decode reads them in place with
``mx.gather_qmm``, ``gather_mm``'s quantized twin (the scores product with ``transpose=True``,
the values product with ``transpose=False``, as mlx-lm's
``quantized_scaled_dot_product_attention`` uses ``quantized_matmul``), which beats gathering
and dequantizing first at every batch and context tried. Prefill chunks gather the packed
blocks and dequantize them, then attend as above. Measured costs: ``docs/kernels.md``.
"""

from __future__ import annotations

import math

import mlx.core as mx

from mlxpa.kernels import cascade_reference, cpu_prefill_attention
from mlxpa.kernels.cascade_reference import (
    CascadePrefix,
    head_sinks,
    merge_states,
    prefix_mask,
    slot_rows,
    stack_queries,
    unstack_queries,
)
from mlxpa.kernels.cpu_streams import cpu_streams
from mlxpa.kernels.device import on_cpu
from mlxpa.kernels.paged_kv import PagedKV
from mlxpa.kernels.quant import QuantizedPool, dense
from mlxpa.kernels.reference import attention_mask, gather_kv

_LOG2E = 1 / math.log(2)
_MASKED = -1e30
# Query rows per tile of a prefill chunk, at most (see the module docstring).
QUERY_TILE = 64
# A prefill chunk over at least this many gathered keys attends in numpy; shorter ones in MLX
# ops, where one synchronisation per layer would cost more than the softmax's exponentials.
NUMPY_MIN_KEYS = 1024


def is_available() -> bool:
    """Whether the default device is the CPU."""
    return on_cpu()


def _f32(x: mx.array) -> mx.array:
    return x if x.dtype == mx.float32 else x.astype(mx.float32)


def _exp2(s: mx.array, mask: mx.array,
          sink: mx.array | None = None) -> tuple[mx.array, mx.array, mx.array]:
    """The base-2 softmax's parts: ``(2^(s - top), top, total)`` (``top``, ``total``: ``[...,
    1]``); see :func:`softmax_exp2`."""
    s = mx.where(mask, s, _MASKED)
    top = s.max(axis=-1, keepdims=True)
    if sink is not None:
        top = mx.maximum(top, sink)
    p = mx.power(2.0, s - top)
    total = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + mx.power(2.0, sink - top)
    return p, top, total


def softmax_exp2(s: mx.array, mask: mx.array, sink: mx.array | None = None) -> mx.array:
    """``softmax`` over the last axis of base-2 logits ``s`` where ``mask`` is True; masked
    entries get probability 0, fully masked rows finite garbage (``s``, ``mask``: broadcast
    together, float32 / bool). ``sink``: base-2 sink logits broadcastable to ``s[..., :1]``,
    one more term in the denominator (attention sinks, as gpt-oss), or None."""
    p, _, total = _exp2(s, mask, sink)
    return p / total


def softmax_exp2_lse(s: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    """:func:`softmax_exp2` (no sink) and the natural log-sum-exp of the visible logits,
    ``[...]`` (``s`` holds base-2 logits: ``lse = (top + log2(total)) ln 2``); a fully
    masked row's is about ``-7e29``, which merges as ``-inf``."""
    p, top, total = _exp2(s, mask)
    return p / total, ((top + mx.log2(total)) * math.log(2))[..., 0]


def _sink(sinks: mx.array | None, kv_heads: int, g: int, extra: int) -> mx.array | None:
    """``[q_heads]`` natural-log sink logits as base-2 logits of shape ``[kv_heads, g]``
    followed by ``extra`` unit axes, to broadcast against grouped scores."""
    if sinks is None:
        return None
    return (sinks.astype(mx.float32) * _LOG2E).reshape(kv_heads, g, *([1] * extra))


def sdpa_exp2(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float,
              sinks: mx.array | None = None) -> mx.array:
    """Masked grouped-query attention over contiguous K/V with the base-2 softmax.

    Args:
        q: ``[B, q_heads, L, D]`` float32.
        k: ``[B, kv_heads, S, D]`` float32; ``q_heads`` is a multiple of ``kv_heads``.
        v: ``[B, kv_heads, S, Dv]`` float32 (``Dv`` may differ from ``D``).
        mask: Boolean, broadcastable to ``[B, 1, L, S]``; True where a query sees a key.
        scale: Softmax scale.
        sinks: ``[q_heads]`` per-head sink logits, or None.

    Returns:
        ``[B, q_heads, L, Dv]`` float32.
    """
    b, heads, length, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    qg = (q * (scale * _LOG2E)).reshape(b, kv_heads, g * length, d)
    s = (qg @ k.swapaxes(-1, -2)).reshape(b, kv_heads, g, length, -1)
    p = softmax_exp2(s, mask[:, :, None], _sink(sinks, kv_heads, g, 2))
    p = p.reshape(b, kv_heads, g * length, -1)
    return (p @ v).reshape(b, heads, length, v.shape[-1])


def key_ranges(rel: list[int], length: int, num_keys: int, tile: int,
               sliding_window: int | None) -> list[tuple[int, int, int, int]]:
    """``(q0, q1, k0, k1)`` per tile of ``tile`` query rows: the gathered keys ``[k0, k1)``
    that contain every key some row sees from queries ``[q0, q1)``.

    ``rel``: per row, the position of query 0 minus the position of gathered key 0
    (``query_start - key_start``). Query ``i`` of a row sees key ``j`` only when
    ``j <= rel + i`` and, with a window ``w``, ``j > rel + i - w``.
    """
    lo, hi = min(rel), max(rel)
    out = []
    for q0 in range(0, length, tile):
        q1 = min(q0 + tile, length)
        k0 = 0 if sliding_window is None else max(0, lo + q0 - sliding_window + 1)
        k1 = min(num_keys, hi + q1)
        out.append((q0, q1, min(k0, k1 - 1), max(k1, 1)))
    return out


def sdpa_exp2_tiled(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float,
                    ranges: list[tuple[int, int, int, int]],
                    sinks: mx.array | None = None) -> mx.array:
    """:func:`sdpa_exp2` one query tile at a time over the tile's key range (``ranges`` from
    :func:`key_ranges`, covering every query row), tiles alternating between the two CPU
    streams of :func:`cpu_streams`; same shapes and result."""
    if len(ranges) == 1 and ranges[0][2:] == (0, k.shape[2]):
        return sdpa_exp2(q, k, v, mask, scale, sinks)
    streams, tiles = cpu_streams(), []
    for t, (q0, q1, k0, k1) in enumerate(ranges):
        with mx.stream(streams[t % len(streams)]):
            tiles.append(sdpa_exp2(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1],
                                   mask[:, :, q0:q1, k0:k1], scale, sinks))
    return mx.concatenate(tiles, axis=2)


def _block_matmul(x: mx.array, pool: mx.array | QuantizedPool, lhs: mx.array | None,
                  rhs: mx.array, transpose: bool) -> mx.array:
    """``x[lhs[i]] @ block[rhs[i]]`` (its transpose when ``transpose``) for the
    ``[block_size, width]`` blocks of ``pool`` flattened over (block, KV head)."""
    num_blocks, kv_heads, bs, width = pool.shape
    if isinstance(pool, QuantizedPool):
        w = pool.map(lambda a: a.reshape(num_blocks * kv_heads, bs, -1))
        return mx.gather_qmm(x, *w.arrays, lhs_indices=lhs, rhs_indices=rhs,
                             transpose=transpose, group_size=w.group_size, bits=w.bits)
    w = pool.reshape(num_blocks * kv_heads, bs, width)
    return mx.gather_mm(x, w.swapaxes(-1, -2) if transpose else w, lhs, rhs)


def decode_attention(q: mx.array, key_cache: mx.array | QuantizedPool,
                     value_cache: mx.array | QuantizedPool, block_tables: mx.array,
                     mask: mx.array, scale: float, sinks: mx.array | None = None,
                     lse: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Attention of ``[B, q_heads, 1, D]`` float32 queries over pool blocks read in place.

    Args:
        q: ``[B, q_heads, 1, D]`` float32.
        key_cache: ``[num_blocks, kv_heads, block_size, D]`` float32 pool, or a quantized one
            with float32 scales.
        value_cache: ``[num_blocks, kv_heads, block_size, Dv]`` float32 pool, or a quantized
            one with float32 scales.
        block_tables: ``[B, nb]`` int32 pool block ids (padding entries any valid id).
        mask: Boolean ``[B, 1, 1, nb * block_size]``; True where the query sees the key.
        scale: Softmax scale.
        sinks: ``[q_heads]`` per-head sink logits, or None.
        lse: Also return each query's natural log-sum-exp ``[B, q_heads]`` (no sinks; one
            part of a cascade).

    Returns:
        ``[B, q_heads, 1, Dv]`` float32 (and the log-sum-exp, float32).
    """
    b, heads, _, d = q.shape
    dv = value_cache.shape[3]
    _, kv_heads, bs, _ = key_cache.shape
    g = heads // kv_heads
    nb = block_tables.shape[1]
    # Batch index of (row, kv head) for the queries, of (block, kv head) for the pools.
    qg = (q * (scale * _LOG2E)).reshape(b * kv_heads, g, d)
    heads_idx = mx.arange(kv_heads, dtype=mx.int32)
    lhs = (mx.arange(b, dtype=mx.int32)[:, None, None] * kv_heads + heads_idx[None, :, None])
    rhs = block_tables[:, None, :] * kv_heads + heads_idx[None, :, None]       # [B, kvh, nb]
    lhs = mx.broadcast_to(lhs, rhs.shape).reshape(-1)
    rhs = rhs.reshape(-1)
    s = _block_matmul(qg, key_cache, lhs, rhs, transpose=True)              # [B*kvh*nb, g, bs]
    s = s.reshape(b, kv_heads, nb, g, bs).transpose(0, 1, 3, 2, 4).reshape(b, kv_heads, g,
                                                                           nb * bs)
    if lse:
        p, sums = softmax_exp2_lse(s, mask)                                  # [B, kvh, g, S]
    else:
        p = softmax_exp2(s, mask, _sink(sinks, kv_heads, g, 1))
    p = p.reshape(b, kv_heads, g, nb, bs).transpose(0, 1, 3, 2, 4).reshape(-1, g, bs)
    out = _block_matmul(p, value_cache, None, rhs, transpose=False)
    out = out.reshape(b, kv_heads, nb, g, dv).sum(axis=2).reshape(b, heads, 1, dv)
    return (out, sums.reshape(b, heads)) if lse else out


def paged_attention(q: mx.array, kv: PagedKV, query_tile: int | None = None) -> mx.array:
    """Paged attention on the CPU; arguments, shapes and result as
    :func:`mlxpa.kernels.reference.paged_attention`. Decode (``L == 1``) reads the pool in
    place (:func:`decode_attention`) when the pool is float32 (quantized: float32 scales);
    prefill chunks and half-precision pools gather (and dequantize), then attend in tiles of
    at most ``query_tile`` query rows (default :data:`QUERY_TILE`): in numpy
    (:func:`mlxpa.kernels.cpu_prefill_attention.sdpa_exp2`) over at least
    :data:`NUMPY_MIN_KEYS` keys, else in MLX ops (:func:`sdpa_exp2_tiled`). Computes in
    float32 whatever the pool dtype (MLX's CPU half-precision matmul is slower and less
    exact)."""
    length = q.shape[2]
    num_keys = kv.block_tables.shape[1] * kv.key_cache.shape[2]
    if length == 1 and kv.key_cache.dtype == mx.float32:
        mask = attention_mask(kv.query_start, length, kv.context_lens, num_keys, kv.key_start,
                              kv.sliding_window)
        out = decode_attention(_f32(q), kv.key_cache, kv.value_cache, kv.block_tables, mask,
                               kv.scale, kv.sinks)
        return out.astype(q.dtype)
    k = _f32(dense(gather_kv(kv.key_cache, kv.block_tables)))
    v = _f32(dense(gather_kv(kv.value_cache, kv.block_tables)))
    if num_keys < NUMPY_MIN_KEYS:
        rel = kv.query_start if kv.key_start is None else kv.query_start - kv.key_start
        mask = attention_mask(kv.query_start, length, kv.context_lens, num_keys, kv.key_start,
                              kv.sliding_window)
        ranges = key_ranges(rel.tolist(), length, num_keys, query_tile or QUERY_TILE,
                            kv.sliding_window)
        return sdpa_exp2_tiled(_f32(q), k, v, mask, kv.scale, ranges,
                               kv.sinks).astype(q.dtype)
    pos = cpu_prefill_attention.Positions.of(kv)
    tile = cpu_prefill_attention.tile_rows(q.shape[0], q.shape[1], num_keys, length,
                                           query_tile or QUERY_TILE)
    ranges = key_ranges((pos.query_start - pos.key_start).tolist(), length, num_keys, tile,
                        kv.sliding_window)
    out = cpu_prefill_attention.sdpa_exp2(_f32(q), k, v, pos, kv.scale, ranges, kv.sinks)
    return out.astype(q.dtype)


def prefix_attention(q: mx.array, kv: PagedKV,
                     prefix: CascadePrefix) -> tuple[mx.array, mx.array]:
    """:func:`mlxpa.kernels.cascade_reference.prefix_attention` with the base-2 softmax: each
    group's shared blocks gathered (a quantized pool's dequantized) once, its stacked
    queries one matrix product per KV head, the unnormalised probabilities multiplied by the
    values and the ``[R * q_per_kv * L, Dv]`` product divided by the sums (not the ``[R *
    q_per_kv * L, S]`` probabilities), on the two CPU streams (:func:`cpu_streams`): decode
    groups in two halves; a prefill step's groups one at a time, each group's slots in
    tiles of about :data:`PREFIX_TILE` stacked query rows. Same arguments and result."""
    length, heads = q.shape[2], q.shape[1]
    streams, outs, sums = cpu_streams(), [], []
    pieces = _prefix_pieces(prefix, length, heads // kv.key_cache.shape[1])
    q2 = q * (kv.scale * _LOG2E)   # base-2 logits, scaled once for every tile
    t = 0
    for a, b, tiles in pieces:
        groups = prefix._replace(block_tables=prefix.block_tables[a:b],
                                 key_start=prefix.key_start[a:b],
                                 prefix_end=prefix.prefix_end[a:b], rows=prefix.rows[a:b])
        with mx.stream(streams[t % len(streams)]):
            k, v = (_f32(dense(gather_kv(c, groups.block_tables)))
                    for c in (kv.key_cache, kv.value_cache))
        tile_outs, tile_sums = [], []
        for r0, r1 in tiles:
            part = groups._replace(rows=groups.rows[:, r0:r1])
            with mx.stream(streams[t % len(streams)]):
                qg = stack_queries(q2, part.rows, k.shape[1])
                s = qg @ k.swapaxes(-1, -2)                              # [g, kvh, R*G*L, S]
                mask = prefix_mask(kv.query_start, part, k.shape[2], kv.sliding_window,
                                   length)
                p, top, total = _exp2(s.reshape(b - a, k.shape[1], r1 - r0, -1, length,
                                                k.shape[2]), mask)
                out = (p.reshape(s.shape) @ v) / total.reshape(*s.shape[:3], 1)
                o, lse = unstack_queries(out, ((top + mx.log2(total)) * math.log(2))[..., 0],
                                         heads, length)
            tile_outs.append(o)
            tile_sums.append(lse)
            t += 1
        outs.append(tile_outs[0] if len(tiles) == 1 else mx.concatenate(tile_outs, axis=1))
        sums.append(tile_sums[0] if len(tiles) == 1 else mx.concatenate(tile_sums, axis=1))
    return (outs[0], sums[0]) if len(outs) == 1 else (mx.concatenate(outs),
                                                      mx.concatenate(sums))


# Stacked query rows (slots x query heads per KV head x L) per tile of a prefill step's
# shared-prefix part: scores of 1,024 x 4,096 keys are 16 MiB.
PREFIX_TILE = 1024


def _prefix_pieces(prefix: CascadePrefix, length: int,
                   q_per_kv: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """``(g0, g1, [(r0, r1), ...])`` per piece of :func:`prefix_attention`'s work: groups
    ``[g0, g1)`` (their shared keys gathered once) and the tiles of their slots. Decode
    (``L == 1``): the groups in two halves, one tile each. Prefill: each group apart, its
    slots in tiles of about :data:`PREFIX_TILE` stacked query rows (two at least when it
    has two slots, so both streams work)."""
    ng, r = prefix.rows.shape
    if length == 1:
        halves = [(0, ng)] if ng < 2 else [(0, ng // 2), (ng // 2, ng)]
        return [(a, b, [(0, r)]) for a, b in halves]
    per = max(1, min(PREFIX_TILE // (q_per_kv * length), -(-r // 2)))
    tiles = [(r0, min(r0 + per, r)) for r0 in range(0, r, per)]
    return [(g, g + 1, tiles) for g in range(ng)]


def cascade_attention(q: mx.array, kv: PagedKV, prefix: CascadePrefix) -> mx.array:
    """Cascade attention on the CPU; arguments, shapes and result as
    :func:`mlxpa.kernels.cascade_reference.cascade_attention`. The rows' own keys are read in place
    for decode (:func:`decode_attention` with its log-sum-exp), gathered for prefill chunks
    (:func:`mlxpa.kernels.cascade_reference.paged_attention_lse`: a chunk's own keys are few), the
    shared prefixes by :func:`prefix_attention`, merged in float32 with the sinks counted
    once (:func:`~mlxpa.kernels.cascade_reference.merge_states`). A half-precision pool takes the
    reference."""
    if kv.key_cache.dtype != mx.float32:
        return cascade_reference.cascade_attention(q, kv, prefix)
    if q.shape[2] == 1:
        num_keys = kv.block_tables.shape[1] * kv.key_cache.shape[2]
        mask = attention_mask(kv.query_start, 1, kv.context_lens, num_keys, kv.key_start,
                              kv.sliding_window)
        own, own_lse = decode_attention(_f32(q), kv.key_cache, kv.value_cache,
                                        kv.block_tables, mask, kv.scale, lse=True)
        own_lse = own_lse[..., None]
    else:
        own, own_lse = cascade_reference.paged_attention_lse(q, kv)
    out, lse = slot_rows(*prefix_attention(q, kv, prefix), prefix.row_slot)
    return merge_states(own, own_lse, out, lse, head_sinks(kv.sinks)).astype(q.dtype)
