"""A prefill chunk's attention on MLX's CPU back end, computed in numpy.

MLX's CPU back end computes element-wise ``exp`` and ``power`` one scalar call at a time on
one thread (``power(2, x)`` at about 200 M elements/s on the x86 VM of ``docs/kernels.md``),
and in a prefill chunk over a long context the softmax's exponentials were most of the
attention's cost: a 64-query x 4-head x 8,192-key tile spent 17.5 ms in the softmax against
7.9 ms in its two matmuls. numpy's ``exp2`` and arithmetic are vectorised, so a prefill
chunk's attention evaluates its inputs, then computes scores, mask, base-2 softmax and the
values product tile by tile in numpy, in place, and hands MLX the ``[B, q_heads, L, Dv]``
result: one synchronisation per attention layer of a prefill step. Decode steps stay lazy in
MLX ops (:func:`mlxpa.kernels.cpu_paged_attention.decode_attention`), where the exponentials
are few.

Tiles are FlashAttention's block skipping (Dao et al. 2022) at query-tile granularity
(:func:`~mlxpa.kernels.cpu_paged_attention.key_ranges`); each tile's mask comes from the
rows' positions (no ``[B, L, S]`` mask is built) and is skipped where the whole tile is
visible. Tiles run on :data:`THREADS` threads (numpy releases the GIL in its loops and BLAS
calls), with the BLAS libraries held to one thread each meanwhile (threadpoolctl; that limit
is the process's, so concurrent callers take turns), so the element-wise passes use every
core instead of one. The softmax is ``2^(s - max) / sum`` on
base-2 logits (the queries scaled by ``scale * log2 e``, FlashAttention-2's ``exp2``), the
division applied to the ``[rows, Dv]`` product, not the ``[rows, keys]`` probabilities.
Measured costs: ``docs/kernels.md``.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import mlx.core as mx
import numpy as np
from threadpoolctl import ThreadpoolController

from mlxpa.kernels.paged_kv import PagedKV

_LOG2E = 1 / math.log(2)
_MASKED = np.float32(-1e30)
# Scores held by one tile (batch rows x query heads x query rows x keys): 4 Mi float32.
TILE_ELEMENTS = 1 << 22
THREADS = max(1, min(4, os.cpu_count() or 1))

_lock = threading.Lock()
# Held while tiles run: the BLAS thread count threadpoolctl sets and restores is the whole
# process's, so two callers at once (two engines on two threads) would restore each other's
# limit of 1 and leave BLAS on one thread for good; they take turns instead.
_run_lock = threading.Lock()
_state: dict[str, object] = {}


def _forget() -> None:
    """After ``fork``: the child has none of the parent's tile threads (and may have copied a
    held lock); make its own."""
    global _lock, _run_lock
    _state.clear()
    _lock, _run_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget)


def _resources() -> tuple[ThreadPoolExecutor, ThreadpoolController]:
    """The tile threads and the BLAS thread controller, made once per process."""
    with _lock:
        if not _state:
            _state["pool"] = ThreadPoolExecutor(THREADS, thread_name_prefix="mlxpa-attn")
            _state["blas"] = ThreadpoolController()
    return _state["pool"], _state["blas"]


class Positions(NamedTuple):
    """Which keys each query sees, by position (all ``[B]`` int numpy arrays).

    ``query_start``: position of row ``b``'s query 0; ``key_start``: position of its gathered
    key 0; ``context_lens``: keys at positions ``>=`` this are past the row's context;
    ``sliding_window``: a query at ``p`` sees only positions ``> p - w`` (mlx-lm's rule), or
    None.
    """

    query_start: np.ndarray
    key_start: np.ndarray
    context_lens: np.ndarray
    sliding_window: int | None

    @classmethod
    def of(cls, kv: PagedKV) -> Positions:
        """The positions of a :class:`~mlxpa.kernels.paged_kv.PagedKV` call (evaluates its
        ``[B]`` position arrays; ``key_start`` None: 0)."""
        mx.eval([a for a in (kv.query_start, kv.context_lens, kv.key_start) if a is not None])
        query_start = np.asarray(kv.query_start)
        key_start = (np.zeros_like(query_start) if kv.key_start is None
                     else np.asarray(kv.key_start))
        return cls(query_start, key_start, np.asarray(kv.context_lens), kv.sliding_window)


def tile_rows(batch: int, heads: int, num_keys: int, length: int, most: int) -> int:
    """Query rows per tile: at most ``most``, and few enough that one tile's scores hold about
    :data:`TILE_ELEMENTS` float32 values (at least 1, at most ``length``)."""
    return max(1, min(length, most, TILE_ELEMENTS // max(1, batch * heads * num_keys)))


def _visible(pos: Positions, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """Boolean ``[B, q1 - q0, k1 - k0]``: query ``q0 + i`` of a row sees gathered key
    ``k0 + j``."""
    qp = (pos.query_start[:, None] + np.arange(q0, q1))[:, :, None]
    kp = (pos.key_start[:, None] + np.arange(k0, k1))[:, None, :]
    vis = (kp <= qp) & (kp < pos.context_lens[:, None, None])
    if pos.sliding_window is not None:
        vis &= kp > qp - pos.sliding_window
    return vis


def sdpa_exp2(q: mx.array, k: mx.array, v: mx.array, pos: Positions, scale: float,
              ranges: list[tuple[int, int, int, int]],
              sinks: mx.array | None = None) -> mx.array:
    """Grouped-query attention over contiguous K/V with the base-2 softmax, in numpy.

    Args:
        q: ``[B, q_heads, L, D]`` float32.
        k: ``[B, kv_heads, S, D]`` float32; ``q_heads`` is a multiple of ``kv_heads``.
        v: ``[B, kv_heads, S, Dv]`` float32 (``Dv`` may differ from ``D``).
        pos: The rows' positions (:class:`Positions`): which keys each query sees.
        scale: Softmax scale.
        ranges: ``(q0, q1, k0, k1)`` tiles covering every query row, each with a key range
            holding every key its rows see
            (:func:`~mlxpa.kernels.cpu_paged_attention.key_ranges`).
        sinks: ``[q_heads]`` per-head sink logits (natural log), one more term in each
            softmax's denominator, or None.

    Returns:
        ``[B, q_heads, L, Dv]`` float32 (a row that sees no key: finite values, unused).
    """
    b, heads, length, d = q.shape
    kv_heads, dv = k.shape[1], v.shape[-1]
    g = heads // kv_heads
    mx.eval(q, k, v)
    qn = np.asarray(q).reshape(b, kv_heads, g, length, d)
    c = np.float32(scale * _LOG2E)
    kn, vn = np.asarray(k), np.asarray(v)
    sink = (None if sinks is None
            else (np.asarray(sinks.astype(mx.float32)) * np.float32(_LOG2E))
            .reshape(1, kv_heads, g, 1, 1))
    out = np.empty((b, kv_heads, g, length, dv), np.float32)

    def tile(r: tuple[int, int, int, int]) -> None:
        q0, q1, k0, k1 = r
        rows, keys = q1 - q0, k1 - k0
        qt = np.multiply(qn[:, :, :, q0:q1], c).reshape(b, kv_heads, g * rows, d)
        s = np.matmul(qt, kn[:, :, k0:k1].swapaxes(-1, -2)).reshape(b, kv_heads, g, rows, keys)
        vis = _visible(pos, q0, q1, k0, k1)
        if not vis.all():   # replaced, not added to: keys past a row's context are garbage
            np.copyto(s, _MASKED, where=~vis[:, None, None])
        top = s.max(axis=-1, keepdims=True)
        if sink is not None:
            np.maximum(top, sink, out=top)
        s -= top
        np.exp2(s, out=s)
        total = s.sum(axis=-1, keepdims=True)
        if sink is not None:
            total += np.exp2(sink - top)
        o = np.matmul(s.reshape(b, kv_heads, g * rows, keys), vn[:, :, k0:k1])
        np.divide(o.reshape(b, kv_heads, g, rows, dv), total, out=out[:, :, :, q0:q1])

    if len(ranges) == 1 or THREADS == 1:
        for r in ranges:
            tile(r)
    else:
        pool, blas = _resources()
        with _run_lock, blas.limit(limits=1, user_api="blas"):
            for _ in pool.map(tile, ranges):   # re-raises a tile's exception here
                pass
    return mx.array(out.reshape(b, heads, length, dv))
