"""Random decode problems and the comparison shared by the dispatcher's self-check and the
kernel tests: ragged rows over a shuffled pool (float or quantized), the float32 reference,
and the tolerance rule."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.kernels.cascade_reference import paged_attention_lse
from mlxpa.kernels.paged_kv import PagedKV
from mlxpa.kernels.quant import QuantizedPool, quantize
from mlxpa.kernels.reference import paged_attention
from mlxpa.utils import cdiv


class Case(NamedTuple):
    """A random decode problem: the arguments of ``paged_attention``."""

    q: mx.array  # [B, q_heads, 1, head_dim]
    kv: PagedKV


def random_case(seed: int, dtype: mx.Dtype, head_dim: int, block_size: int, q_heads: int,
                kv_heads: int, lens: list[int], window: int | None = None, trim: bool = False,
                pad_blocks: int = 1, quant: tuple[int, int, int] | None = None,
                skip_blocks: list[int] | None = None) -> Case:
    """Random pool and ragged rows of ``lens`` keys, the query at position ``len - 1``.

    Blocks are shuffled, tables padded with the null block 0, and every slot of the pool
    (block 0 included) holds random values, so reading a wrong key changes the result.
    ``trim`` cuts the tables to the window as the engine does (``key_start`` a multiple of
    the block size). ``skip_blocks``: per row, leading blocks left out of its table (as
    cascade attention's own-keys part, after a shared prefix; ``key_start`` set; with
    ``trim``, the later of the two starts). ``quant``: ``(kbits, vbits, group_size)``: the
    pools are ``mx.quantize``'d (:class:`QuantizedPool`, scales in ``dtype``).
    """
    rng = np.random.default_rng(seed)
    starts = [max(0, n - window) // block_size * block_size if trim and window else 0
              for n in lens]
    if skip_blocks is not None:
        starts = [max(s, k * block_size) for s, k in zip(starts, skip_blocks)]
    counts = [cdiv(n - s, block_size) if n > s else 0 for n, s in zip(lens, starts)]
    num_blocks = 1 + sum(counts) + 2
    perm = rng.permutation(np.arange(1, num_blocks)).tolist()
    table = np.zeros((len(lens), max(counts + [1]) + pad_blocks), np.int32)
    for r, c in enumerate(counts):
        table[r, :c] = [perm.pop() for _ in range(c)]

    def normal(*shape):
        return mx.array(rng.standard_normal(shape, np.float32)).astype(dtype)

    pool = (num_blocks, kv_heads, block_size, head_dim)
    kc, vc = normal(*pool), normal(*pool)
    if quant is not None:
        kbits, vbits, group_size = quant
        kc, vc = quantize(kc, kbits, group_size), quantize(vc, vbits, group_size)
    lens_np = np.array(lens, np.int32)
    key_start = (mx.array(np.array(starts, np.int32)) if trim or skip_blocks is not None
                 else None)
    q = normal(len(lens), q_heads, 1, head_dim)
    return Case(q, PagedKV(kc, vc, mx.array(table), mx.array(lens_np),
                           mx.array(np.maximum(lens_np - 1, 0)), head_dim ** -0.5, window,
                           key_start))


def _f32(cache: mx.array | QuantizedPool) -> mx.array | QuantizedPool:
    """The pool in float32 (a quantized pool's scales and biases; its values dequantize
    exactly as in its own dtype, then are not rounded back)."""
    if isinstance(cache, QuantizedPool):
        return cache._replace(scales=cache.scales.astype(mx.float32),
                              biases=cache.biases.astype(mx.float32))
    return cache.astype(mx.float32)


def reference_f32(case: Case, lse: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """``reference.paged_attention`` of ``case`` in float32 on the CPU (float32 result), or
    with ``lse`` ``cascade_reference.paged_attention_lse``'s output and log-sum-exps."""
    kv = case.kv._replace(key_cache=_f32(case.kv.key_cache),
                          value_cache=_f32(case.kv.value_cache))
    fn = paged_attention_lse if lse else paged_attention
    with mx.stream(mx.cpu):
        out = fn(case.q.astype(mx.float32), kv)
        mx.eval(out)
    return out


def lse_mismatch(out: tuple[mx.array, mx.array], ref: tuple[mx.array, mx.array],
                 context_lens: mx.array, atol: float, rtol: float) -> str | None:
    """Why a native ``_lse`` twin's ``(output, log-sum-exp)`` fails to match the float32
    reference's (:func:`mismatch` on the outputs; the log-sum-exps within ``atol + rtol *
    |ref|``, and at most ``-1e30`` on rows without keys), or None when both match."""
    why = mismatch(out[0], ref[0], context_lens, atol, rtol)
    if why:
        return why
    got, want = np.array(out[1].astype(mx.float32)), np.array(ref[1])
    empty = np.array(context_lens) == 0
    if not np.all(got[empty] <= -1e30):
        return "rows without keys have a finite log-sum-exp"
    err = np.abs(got[~empty] - want[~empty]) - rtol * np.abs(want[~empty])
    if err.size and not np.all(err <= atol):   # NaN fails too
        return f"log-sum-exp max error {np.nanmax(np.abs(got[~empty] - want[~empty])):.3g}"
    return None


def mismatch(out: mx.array, ref: mx.array, context_lens: mx.array, atol: float,
             rtol: float) -> str | None:
    """Why ``out`` fails to match ``ref`` (``|out - ref| <= atol + rtol * |ref|`` on rows
    with keys, exact zeros on rows without), or None when it matches."""
    o = np.array(out.astype(mx.float32))
    r = np.array(ref.astype(mx.float32))
    empty = np.array(context_lens) == 0
    if not np.all(o[empty] == 0):
        return "rows without keys are not zero"
    err = np.abs(o[~empty] - r[~empty]) - rtol * np.abs(r[~empty])
    if err.size and not np.all(err <= atol):   # NaN fails too
        return f"max error {np.nanmax(np.abs(o[~empty] - r[~empty])):.3g} (atol {atol})"
    return None
