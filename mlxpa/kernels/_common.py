"""Launch planning shared by the Metal and CUDA paged-attention kernels.

Both back ends run the same three kernel bodies (``metal_paged_attention.SOURCES``) with the
same inputs, template parameters and grids; only the kernel constructor differs. This module
decides which decode variant runs (v1 single pass or v2 partitioned, after vLLM's
PagedAttention V1/V2, Kwon et al. 2023), computes the grids, and chains the launches.

Kernel inputs (all kinds share the first nine; ``reduce`` reads v2's outputs)::

    q            [B, q_heads, D]                          T
    key_cache    [num_blocks, kv_heads, block_size, D]    T
    value_cache  [num_blocks, kv_heads, block_size, D]    T
    block_tables [B, max_blocks]                          int32
    context_lens [B] int32   query_start [B] int32   key_start [B] int32
    meta         [2] int32:  (max_blocks, num_partitions)
    scale        [1] float32

Rows whose visible key range is empty (context length 0, or a window past the table) output
zeros. The reference gives such rows an arbitrary (finite) average instead.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.core.block_pool import cdiv
from mlxpa.kernels.reference import paged_attention

PARTITION_SIZE = 512      # tokens per v2 partition
V1_SIMDGROUPS = 32        # v1 threadgroup: 32 simdgroups = 1024 threads
V2_SIMDGROUPS = 8         # v2 threadgroup: 256 threads, each lane holding G * D / 32 accumulators
LONG_CONTEXT = 8192       # beyond this many keys v2 always runs
# NOTE: unmeasured guess, to tune with scripts/gpu_check.py: about two 1024-thread v1
# threadgroups are resident per H100/H200 SM (132 SMs) or per core of the largest Apple GPUs
# (up to 80 cores); with fewer v1 threadgroups the GPU idles and v2's partitions fill it.
FILL_THREADGROUPS = 256
MAX_V2_ACCUMULATORS = 64  # per-lane floats of q and acc each (G * D / 32); above, v1 only

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
HEAD_DIMS = (64, 128, 256)
BLOCK_SIZES = (8, 16, 32)

INPUT_NAMES = ("q", "key_cache", "value_cache", "block_tables", "context_lens", "query_start",
               "key_start", "meta", "scale")
KERNEL_INPUTS = {"v1": INPUT_NAMES, "v2": INPUT_NAMES,
                 "reduce": ("partial_out", "max_logits", "exp_sums", "meta")}
KERNEL_OUTPUTS = {"v1": ("out",), "v2": ("partial_out", "max_logits", "exp_sums"),
                  "reduce": ("out",)}


class Launch(NamedTuple):
    """One kernel launch: grid and threadgroup in threads (MLX's dispatchThreads rule)."""

    kind: str                                   # "v1" | "v2" | "reduce"
    template: tuple[tuple[str, object], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[mx.Dtype, ...]


class DecodeShape(NamedTuple):
    """Static facts of one decode call; everything a launch depends on."""

    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    max_blocks: int
    window: int      # 0: full attention
    dtype: mx.Dtype

    @property
    def span(self) -> int:
        """Upper bound on the keys one query sees (tokens)."""
        span = self.max_blocks * self.block_size
        return min(span, self.window) if self.window else span

    @property
    def num_partitions(self) -> int:
        return max(1, math.ceil(self.span / PARTITION_SIZE))


def kernel_name(kind: str, source: str, header: str = "") -> str:
    """Kernel name with a source hash, so a changed body never hits a stale JIT cache (MLX's
    CUDA back end caches PTX on disk by name)."""
    digest = hashlib.sha1((header + source).encode()).hexdigest()[:10]
    return f"mlxpa_paged_{kind}_{digest}"


def decode_shape(q: mx.array, key_cache: mx.array, block_tables: mx.array,
                 sliding_window: int | None) -> DecodeShape:
    b, hq, _, d = q.shape
    _, hkv, bs, _ = key_cache.shape
    return DecodeShape(b, hq, hkv, d, bs, block_tables.shape[1], sliding_window or 0, q.dtype)


def supported(q: mx.array, key_cache: mx.array, value_cache: mx.array) -> bool:
    """Whether a native decode kernel handles these arrays (else the reference runs)."""
    if q.ndim != 4 or key_cache.ndim != 4 or q.shape[2] != 1 or q.shape[0] == 0:
        return False
    _, hq, _, d = q.shape
    _, hkv, bs, dk = key_cache.shape
    return (q.dtype in DTYPES and key_cache.dtype == q.dtype and value_cache.dtype == q.dtype
            and value_cache.shape == key_cache.shape and d == dk and d in HEAD_DIMS
            and bs in BLOCK_SIZES and hkv > 0 and hq % hkv == 0)


def variants(q_heads: int, kv_heads: int, head_dim: int) -> tuple[str, ...]:
    """The variants ``choose_variant`` may pick for these heads (v2 needs few accumulators)."""
    fits = q_heads // kv_heads * head_dim // 32 <= MAX_V2_ACCUMULATORS
    return ("v1", "v2") if fits else ("v1",)


def choose_variant(shape: DecodeShape) -> str:
    """v1 or v2 for a decode call (vLLM's rule, with an Apple-sized fill threshold).

    v1 when the keys fit one partition (v2 would only add the reduce), or when the context is
    at most ``LONG_CONTEXT`` and ``batch * q_heads`` v1 threadgroups already fill the GPU;
    otherwise v2, whose ``batch * kv_heads * partitions`` threadgroups spread a long context
    over the GPU. v2 keeps ``G * D / 32`` accumulators per lane, so large GQA groups with
    large heads stay on v1.
    """
    if shape.num_partitions == 1 or "v2" not in variants(shape.q_heads, shape.kv_heads,
                                                          shape.head_dim):
        return "v1"
    if shape.span > LONG_CONTEXT:
        return "v2"
    return "v1" if shape.batch * shape.q_heads >= FILL_THREADGROUPS else "v2"


def plan(shape: DecodeShape, variant: str, v1_simdgroups: int = V1_SIMDGROUPS,
         v2_simdgroups: int = V2_SIMDGROUPS) -> list[Launch]:
    """The launches of one decode call, in order."""
    s = shape
    common = (("T", s.dtype), ("D", s.head_dim), ("BS", s.block_size), ("WINDOW", s.window),
              ("HQ", s.q_heads), ("HKV", s.kv_heads))
    if variant == "v1":
        t = 32 * v1_simdgroups
        return [Launch("v1", common + (("NSG", v1_simdgroups),), (s.q_heads * t, s.batch, 1),
                       (t, 1, 1), ((s.batch, s.q_heads, s.head_dim),), (s.dtype,))]
    assert variant == "v2", variant
    t, p = 32 * v2_simdgroups, s.num_partitions
    rows = (s.batch, s.q_heads, p)
    return [
        Launch("v2", common + (("NSG", v2_simdgroups), ("PART", PARTITION_SIZE)),
               (s.kv_heads * t, s.batch, p), (t, 1, 1), (rows + (s.head_dim,), rows, rows),
               (mx.float32, mx.float32, mx.float32)),
        Launch("reduce", (("T", s.dtype), ("D", s.head_dim), ("HQ", s.q_heads)),
               (s.q_heads * s.head_dim, s.batch, 1), (s.head_dim, 1, 1),
               ((s.batch, s.q_heads, s.head_dim),), (s.dtype,)),
    ]


def decode_inputs(q: mx.array, key_cache: mx.array, value_cache: mx.array,
                  block_tables: mx.array, context_lens: mx.array, query_start: mx.array,
                  key_start: mx.array | None, scale: float, shape: DecodeShape) -> list[mx.array]:
    """The nine kernel inputs, in ``INPUT_NAMES`` order."""
    i32 = mx.int32
    if key_start is None:
        key_start = mx.zeros((shape.batch,), i32)
    meta = mx.array([shape.max_blocks, shape.num_partitions], dtype=i32)
    return [q.reshape(shape.batch, shape.q_heads, shape.head_dim), key_cache, value_cache,
            block_tables.astype(i32), context_lens.astype(i32), query_start.astype(i32),
            key_start.astype(i32), meta, mx.array([scale], dtype=mx.float32)]


def run_decode(get_kernel: Callable[[str], Callable], q: mx.array, key_cache: mx.array,
               value_cache: mx.array, block_tables: mx.array, context_lens: mx.array,
               query_start: mx.array, *, scale: float, sliding_window: int | None = None,
               key_start: mx.array | None = None, variant: str | None = None) -> mx.array:
    """Decode attention through native kernels; arguments as ``reference.paged_attention``
    with ``L == 1``. ``get_kernel(kind)`` returns a ``metal_kernel``/``cuda_kernel`` callable.

    Returns:
        ``[B, q_heads, 1, head_dim]`` in ``q.dtype``.
    """
    shape = decode_shape(q, key_cache, block_tables, sliding_window)
    inputs = decode_inputs(q, key_cache, value_cache, block_tables, context_lens, query_start,
                           key_start, scale, shape)
    outs: list[mx.array] = []
    for launch in plan(shape, variant or choose_variant(shape)):
        args = inputs if launch.kind != "reduce" else outs + [inputs[7]]
        outs = get_kernel(launch.kind)(
            inputs=args, template=list(launch.template), grid=launch.grid,
            threadgroup=launch.threadgroup, output_shapes=list(launch.output_shapes),
            output_dtypes=list(launch.output_dtypes))
    return outs[0].reshape(shape.batch, shape.q_heads, 1, shape.head_dim)


class Case(NamedTuple):
    """A random decode problem: ``args`` and ``kwargs`` of ``paged_attention``."""

    args: tuple[mx.array, ...]  # q, key/value cache, block_tables, context_lens, query_start
    kwargs: dict


def random_case(seed: int, dtype: mx.Dtype, head_dim: int, block_size: int, q_heads: int,
                kv_heads: int, lens: list[int], window: int | None = None, trim: bool = False,
                pad_blocks: int = 1) -> Case:
    """Random pool and ragged rows of ``lens`` keys, the query at position ``len - 1``.

    Blocks are shuffled, tables padded with the null block 0, and every slot of the pool
    (block 0 included) holds random values, so reading a wrong key changes the result.
    ``trim`` cuts the tables to the window as the engine does (``key_start`` a multiple of
    the block size).
    """
    rng = np.random.default_rng(seed)
    starts = [max(0, n - window) // block_size * block_size if trim and window else 0
              for n in lens]
    counts = [cdiv(n - s, block_size) if n > s else 0 for n, s in zip(lens, starts)]
    num_blocks = 1 + sum(counts) + 2
    perm = rng.permutation(np.arange(1, num_blocks)).tolist()
    table = np.zeros((len(lens), max(counts + [1]) + pad_blocks), np.int32)
    for r, c in enumerate(counts):
        table[r, :c] = [perm.pop() for _ in range(c)]

    def normal(*shape):
        return mx.array(rng.standard_normal(shape, np.float32)).astype(dtype)

    pool = (num_blocks, kv_heads, block_size, head_dim)
    lens_np = np.array(lens, np.int32)
    kwargs = {"scale": head_dim ** -0.5, "sliding_window": window,
              "key_start": mx.array(np.array(starts, np.int32)) if trim else None}
    return Case((normal(len(lens), q_heads, 1, head_dim), normal(*pool), normal(*pool),
                 mx.array(table), mx.array(lens_np), mx.array(np.maximum(lens_np - 1, 0))),
                kwargs)


def reference_f32(case: Case) -> mx.array:
    """``reference.paged_attention`` of ``case`` in float32 on the CPU (float32 result)."""
    q, kc, vc, bt, cl, qs = case.args
    f32 = mx.float32
    with mx.stream(mx.cpu):
        out = paged_attention(q.astype(f32), kc.astype(f32), vc.astype(f32), bt, cl, qs,
                              **case.kwargs)
        mx.eval(out)
    return out


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
