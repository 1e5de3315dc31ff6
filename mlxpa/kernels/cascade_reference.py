"""Cascade attention (Hydragen, Juravsky et al. 2024; FlashInfer's cascade inference and its
``merge_state``): rows that share leading blocks (decode rows, and prefill chunks over a
prefix cached before the step) attend over them once per group, the
group's queries stacked into one matrix product (:func:`prefix_attention`), and over their own
remaining keys apart (:func:`paged_attention_lse` from a key offset); each part returns its
log-sum-exp, and :func:`merge_states` combines the two in float32 (``lse = logaddexp(lse_a,
lse_b)``, ``o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse)``), with the attention sinks
counted once, in the merge. :func:`cascade_attention` is the specification of every
back end's cascade path; it builds on the paged-attention specification of
:mod:`mlxpa.kernels.reference` (its block gather and mask), whose result it equals.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from mlxpa.kernels.paged_kv import PagedKV
from mlxpa.kernels.quant import dense
from mlxpa.kernels.reference import attention_mask, gather_kv


class CascadePrefix(NamedTuple):
    """The shared prefixes of one batch (decode rows, or prefill chunks) in one layer
    (cascade attention).

    The rows ``rows[g]`` of group ``g`` all see the keys at positions ``key_start[g]`` to
    ``prefix_end[g] - 1``, held in the blocks ``block_tables[g]`` (the same blocks for every
    member); a row's sliding window may mask the first of them.

    Attributes:
        block_tables: ``[G, max_blocks]`` int32 pool block ids of each group's shared keys
            from position ``key_start[g]`` on (padding: any block; masked).
        key_start: ``[G]`` int32 position of the first key in ``block_tables[g]`` (a multiple
            of the block size).
        prefix_end: ``[G]`` int32 position after the group's last shared key (a multiple of
            the block size); its rows' own keys start there.
        rows: ``[G, R]`` int32 batch rows of each group's members (padding: any row; what a
            padding slot computes is never read).
        row_slot: ``[B]`` int32 per batch row, ``g * R + r`` for its place in ``rows``, or
            ``G * R`` for a row in no group.
    """

    block_tables: mx.array
    key_start: mx.array
    prefix_end: mx.array
    rows: mx.array
    row_slot: mx.array


def _softmax_lse(s: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    """Softmax over the last axis of float32 logits ``s`` where ``mask`` (broadcast) is True,
    and the log-sum-exp of the visible logits (``[..., 1]``); rows without a visible logit
    get probabilities 0 and log-sum-exp ``-inf``."""
    s = mx.where(mask, s, -mx.inf)
    top = s.max(axis=-1, keepdims=True)
    top = mx.where(top == -mx.inf, 0.0, top)
    p = mx.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    lse = mx.where(total > 0, top + mx.log(total), -mx.inf)
    return p / mx.where(total > 0, total, 1.0), lse


def paged_attention_lse(q: mx.array, kv: PagedKV) -> tuple[mx.array, mx.array]:
    """:func:`~mlxpa.kernels.reference.paged_attention` that also returns each query's
    log-sum-exp: one part of a cascade, its keys starting at ``kv.key_start`` (``kv.sinks``
    is not read: the merge counts them).

    Arguments as :func:`~mlxpa.kernels.reference.paged_attention`.

    Returns:
        ``(out [B, q_heads, L, v_dim], lse [B, q_heads, L])``, both float32; ``lse`` is the
        natural log of the softmax denominator over the visible keys of the scaled scores;
        a query with no visible key gets output 0 and ``lse = -inf``.
    """
    k = dense(gather_kv(kv.key_cache, kv.block_tables)).astype(mx.float32)
    v = dense(gather_kv(kv.value_cache, kv.block_tables)).astype(mx.float32)
    b, heads, length, d = q.shape
    kv_heads, num_keys = k.shape[1], k.shape[2]
    g = heads // kv_heads
    mask = attention_mask(kv.query_start, length, kv.context_lens, num_keys, kv.key_start,
                          kv.sliding_window)                               # [B, 1, L, S]
    qg = q.astype(mx.float32).reshape(b, kv_heads, g * length, d)
    s = (qg @ k.swapaxes(-1, -2) * kv.scale).reshape(b, kv_heads, g, length, num_keys)
    p, lse = _softmax_lse(s, mask[:, :, None])
    out = p.reshape(b, kv_heads, g * length, num_keys) @ v
    return out.reshape(b, heads, length, -1), lse.reshape(b, heads, length)


def prefix_attention(q: mx.array, kv: PagedKV,
                     prefix: CascadePrefix) -> tuple[mx.array, mx.array]:
    """Each group's rows over the group's shared keys: the group's blocks gathered (and
    dequantized) once, its queries stacked into one ``[R * q_per_kv * L, D]`` operand per KV
    head, so the scores are one matrix product per group instead of one product per row
    (Hydragen's inter-sequence batching; FlashInfer's cascade attention takes several query
    tokens per request the same way).

    Args:
        q: ``[B, q_heads, L, head_dim]`` queries: decode rows (``L == 1``) or prefill chunks
            whose shared keys were all written before this step (a row's query ``i`` sits at
            ``query_start + i``; padding queries past a row's chunk compute values no one
            reads).
        kv: The layer's pools, ``query_start``, ``scale`` and ``sliding_window``
            (:class:`PagedKV`; its rows' own tables are not read).
        prefix: The groups (:class:`CascadePrefix`).

    Returns:
        ``(out [G, R, q_heads, L, v_dim], lse [G, R, q_heads, L])`` float32, per group slot.
    """
    k = dense(gather_kv(kv.key_cache, prefix.block_tables)).astype(mx.float32)  # [G, kvh, S, D]
    v = dense(gather_kv(kv.value_cache, prefix.block_tables)).astype(mx.float32)
    qg = stack_queries(q, prefix.rows, k.shape[1])
    s = qg @ k.swapaxes(-1, -2) * kv.scale                               # [G, kvh, R*g*L, S]
    ng, r = prefix.rows.shape
    length = q.shape[2]
    mask = prefix_mask(kv.query_start, prefix, k.shape[2], kv.sliding_window, length)
    p, lse = _softmax_lse(s.reshape(ng, k.shape[1], r, -1, length, k.shape[2]), mask)
    return unstack_queries(p.reshape(s.shape) @ v, lse, q.shape[1], length)


def stack_queries(q: mx.array, rows: mx.array, kv_heads: int) -> mx.array:
    """Each group's queries (``q`` ``[B, q_heads, L, D]``, ``rows`` ``[G, R]``) stacked per
    KV head: ``[G, kv_heads, R * q_per_kv * L, D]`` float32, row ``(r * q_per_kv + j) * L +
    i`` the query ``i`` of query head ``j`` of the KV head, of slot ``r``."""
    _, heads, length, d = q.shape
    ng, r = rows.shape
    qr = q.astype(mx.float32)[rows]                                     # [G, R, H, L, D]
    g = heads // kv_heads
    return qr.reshape(ng, r, kv_heads, g, length, d).transpose(0, 2, 1, 3, 4, 5).reshape(
        ng, kv_heads, r * g * length, d)


def unstack_queries(out: mx.array, lse: mx.array, heads: int,
                    length: int = 1) -> tuple[mx.array, mx.array]:
    """:func:`stack_queries`'s layout undone: ``out`` ``[G, kv_heads, R * q_per_kv * L, Dv]``
    and ``lse`` (``G * R * q_heads * L`` values in that order) to ``[G, R, q_heads, L, Dv]``
    and ``[G, R, q_heads, L]``."""
    ng, kv_heads, rows, dv = out.shape
    g = heads // kv_heads
    r = rows // (g * length)
    return (out.reshape(ng, kv_heads, r, g, length, dv).transpose(0, 2, 1, 3, 4, 5).reshape(
                ng, r, heads, length, dv),
            lse.reshape(ng, kv_heads, r, g, length).transpose(0, 2, 1, 3, 4).reshape(
                ng, r, heads, length))


def prefix_mask(query_start: mx.array, prefix: CascadePrefix, num_keys: int,
                sliding_window: int | None = None, length: int = 1) -> mx.array:
    """Boolean ``[G, 1, R, 1, L, S]`` mask of a group slot's queries over its group's
    gathered shared keys: inside the prefix, causal, inside each query's window."""
    kpos = prefix.key_start[:, None] + mx.arange(num_keys)[None, :]              # [G, S]
    qpos = (query_start[prefix.rows][:, :, None]
            + mx.arange(length, dtype=mx.int32)[None, None, :])[..., None]   # [G, R, L, 1]
    kpos = kpos[:, None, None, :]                                             # [G, 1, 1, S]
    mask = (kpos < prefix.prefix_end[:, None, None, None]) & (kpos <= qpos)
    if sliding_window is not None:
        mask = mask & (kpos > qpos - sliding_window)
    return mask[:, None, :, None]


def slot_rows(out: mx.array, lse: mx.array,
              row_slot: mx.array) -> tuple[mx.array, mx.array]:
    """Per batch row, its group slot's ``out`` (``[G, R, H, L, Dv]``) and ``lse`` (``[G, R,
    H, L]``): ``[B, H, L, Dv]`` and ``[B, H, L]``; a row in no group (``row_slot == G * R``)
    gets 0 and ``-inf``."""
    tail = out.shape[2:]
    flat_out = mx.concatenate([out.reshape(-1, *tail), mx.zeros((1, *tail), out.dtype)])
    flat_lse = mx.concatenate([lse.reshape(-1, *tail[:-1]),
                               mx.full((1, *tail[:-1]), -mx.inf, lse.dtype)])
    return flat_out[row_slot], flat_lse[row_slot]


def merge_states(out_a: mx.array, lse_a: mx.array, out_b: mx.array, lse_b: mx.array,
                 sinks: mx.array | None = None) -> mx.array:
    """Attention over the union of two disjoint key sets from each set's normalised output
    and log-sum-exp, in float32 (FlashInfer's ``merge_state``): ``lse = logaddexp(lse_a,
    lse_b)``, ``out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse)``.

    Args:
        out_a, out_b: ``[..., Dv]`` float32 outputs of each part.
        lse_a, lse_b: ``[...]`` float32 log-sum-exps (``-inf``: the part saw no key).
        sinks: Sink logits broadcast against ``lse`` (attention sinks, as gpt-oss: one more
            term of the denominator, counted once here; ``[H, 1]`` for ``[B, H, L]``
            log-sum-exps), or None.

    Returns:
        ``[..., Dv]`` float32; 0 where neither part saw a key (and no sink).
    """
    lse = mx.logaddexp(lse_a, lse_b)
    if sinks is not None:
        lse = mx.logaddexp(lse, sinks.astype(mx.float32))
    lse = mx.where(lse == -mx.inf, 0.0, lse)   # no key at all: both weights exp(-inf) = 0
    return (out_a * mx.exp(lse_a - lse)[..., None] + out_b * mx.exp(lse_b - lse)[..., None])


def head_sinks(sinks: mx.array | None) -> mx.array | None:
    """``[q_heads]`` sink logits shaped ``[q_heads, 1]`` to merge ``[B, q_heads, L]``
    log-sum-exps (:func:`merge_states`), or None."""
    return None if sinks is None else sinks[:, None]


def cascade_merge(q: mx.array, kv: PagedKV, prefix: CascadePrefix, suffix_out: mx.array,
                  suffix_lse: mx.array) -> mx.array:
    """The shared-prefix part of :func:`cascade_attention` (:func:`prefix_attention`) merged
    with a suffix part computed by any back end: ``suffix_out [B, q_heads, L, v_dim]`` and
    ``suffix_lse [B, q_heads, L]`` (float32). Returns ``[B, q_heads, L, v_dim]`` in
    ``q.dtype``; ``kv.sinks`` counted once, in the merge."""
    out, lse = prefix_attention(q, kv, prefix)
    out, lse = slot_rows(out, lse, prefix.row_slot)
    merged = merge_states(suffix_out.astype(mx.float32), suffix_lse.astype(mx.float32), out,
                          lse, head_sinks(kv.sinks))
    return merged.astype(q.dtype)


def cascade_attention(q: mx.array, kv: PagedKV, prefix: CascadePrefix) -> mx.array:
    """Attention in two parts (cascade attention): each group's shared prefix once for
    all its rows (:func:`prefix_attention`), each row's own keys apart
    (:func:`paged_attention_lse`), merged by their log-sum-exp (:func:`merge_states`). Equal
    to :func:`~mlxpa.kernels.reference.paged_attention` over each row's whole visible context.

    Args:
        q: ``[B, q_heads, L, head_dim]`` queries: decode rows, or prefill chunks whose
            group's shared keys were all written before this step.
        kv: The layer's pools (float or quantized) and the batch's tables
            (:class:`PagedKV`); ``kv.block_tables`` lists, per row, the blocks of its own
            keys from ``kv.key_start[b]`` (a group member: from its group's ``prefix_end``
            on, or later where its window starts after it; a row in no group: its whole
            visible context).
        prefix: The groups' shared keys (:class:`CascadePrefix`).

    Returns:
        ``[B, q_heads, L, v_dim]`` in ``q.dtype``.
    """
    out, lse = paged_attention_lse(q, kv)
    return cascade_merge(q, kv, prefix, out, lse)
