"""Launch planning shared by the Metal and CUDA paged-attention kernels.

Both back ends run the same kernel bodies (``paged_attention_source.SOURCES``) with the same
inputs, template parameters and grids; only the kernel constructor differs. This module
decides which decode variant runs (v1 single pass or v2 partitioned, after vLLM's
PagedAttention V1/V2, Kwon et al. 2023), computes the grids, and chains the launches.

Kernel inputs (v1 and v2 share the first nine; ``reduce`` reads v2's outputs)::

    q            [B, q_heads, D]                          T
    key_cache    [num_blocks, kv_heads, block_size, D]    T
    value_cache  [num_blocks, kv_heads, block_size, D]    T
    block_tables [B, max_blocks]                          int32
    context_lens [B] int32   query_start [B] int32   key_start [B] int32
    meta         [2] int32:  (max_blocks, num_partitions)
    scale        [1] float32

Over quantized pools (``qv1``/``qv2``) each of ``key_cache`` and ``value_cache`` is three
inputs: ``k_packed [num_blocks, kv_heads, block_size, D * KBITS / 32]`` uint32, ``k_scales``
and ``k_biases [num_blocks, kv_heads, block_size, D / GS]`` T (and ``v_*`` with ``VBITS``).

Rows whose visible key range is empty (context length 0, or a window past the table) output
zeros. The reference gives such rows an arbitrary (finite) average instead.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx

from mlxpa.kernels.paged_kv import PagedKV
from mlxpa.kernels.quant import QuantizedPool

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
QUANT_BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)

_ROW_INPUTS = ("block_tables", "context_lens", "query_start", "key_start", "meta", "scale")
INPUT_NAMES = ("q", "key_cache", "value_cache", *_ROW_INPUTS)
QUANT_INPUT_NAMES = ("q", "k_packed", "k_scales", "k_biases", "v_packed", "v_scales",
                     "v_biases", *_ROW_INPUTS)
_V2_OUTPUTS = ("partial_out", "max_logits", "exp_sums")
KERNEL_INPUTS = {"v1": INPUT_NAMES, "v2": INPUT_NAMES, "qv1": QUANT_INPUT_NAMES,
                 "qv2": QUANT_INPUT_NAMES, "reduce": (*_V2_OUTPUTS, "meta"),
                 "v1_lse": INPUT_NAMES, "qv1_lse": QUANT_INPUT_NAMES,
                 "reduce_lse": (*_V2_OUTPUTS, "meta")}
KERNEL_OUTPUTS = {"v1": ("out",), "v2": _V2_OUTPUTS, "qv1": ("out",), "qv2": _V2_OUTPUTS,
                  "reduce": ("out",), "v1_lse": ("out", "lse"), "qv1_lse": ("out", "lse"),
                  "reduce_lse": ("out", "lse")}


class Launch(NamedTuple):
    """One kernel launch: grid and threadgroup in threads (MLX's dispatchThreads rule)."""

    kind: str                                   # a key of KERNEL_INPUTS
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
    kbits: int = 0   # quantized pools: bits per key element (0: float pools)
    vbits: int = 0   # bits per value element
    group_size: int = 0

    @property
    def quant(self) -> tuple[int, int, int] | None:
        """``(kbits, vbits, group_size)`` of quantized pools, None for float pools."""
        return (self.kbits, self.vbits, self.group_size) if self.kbits else None

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


def pool_quant(key_cache: mx.array | QuantizedPool,
               value_cache: mx.array | QuantizedPool) -> tuple[int, int, int] | None:
    """``(kbits, vbits, group_size)`` of quantized pools, None for float ones."""
    if not isinstance(key_cache, QuantizedPool):
        return None
    return key_cache.bits, value_cache.bits, key_cache.group_size


def decode_shape(q: mx.array, kv: PagedKV) -> DecodeShape:
    """The static facts of a decode call."""
    b, hq, _, d = q.shape
    _, hkv, bs, _ = kv.key_cache.shape
    quant = pool_quant(kv.key_cache, kv.value_cache) or (0, 0, 0)
    return DecodeShape(b, hq, hkv, d, bs, kv.block_tables.shape[1], kv.sliding_window or 0,
                       q.dtype, *quant)


def supported(q: mx.array, kv: PagedKV) -> bool:
    """Whether a native decode kernel handles these arrays (else the reference runs)."""
    key_cache, value_cache = kv.key_cache, kv.value_cache
    if q.ndim != 4 or len(key_cache.shape) != 4 or q.shape[2] != 1 or q.shape[0] == 0:
        return False
    if isinstance(key_cache, QuantizedPool) != isinstance(value_cache, QuantizedPool):
        return False
    if isinstance(key_cache, QuantizedPool) and not (
            key_cache.bits in QUANT_BITS and value_cache.bits in QUANT_BITS
            and key_cache.group_size == value_cache.group_size
            and key_cache.group_size in GROUP_SIZES):
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


# Blocks that fill a large NVIDIA GPU (an H200 has 132 streaming multiprocessors).
CUDA_FILL_BLOCKS = 132


def choose_variant_cuda(shape: DecodeShape) -> str:
    """v1 or v2 for a decode call on CUDA, from an H200 sitting (``scripts/gpu_check.sh``,
    docs/kernels.md): v2 whenever the keys span more than one partition (2-4x faster at 8,192
    keys, batch 1 and 64); at one partition v1 only while v2's ``batch * kv_heads`` blocks
    would not fill the GPU. Variants v2 cannot run (large GQA heads) stay on v1."""
    if "v2" not in variants(shape.q_heads, shape.kv_heads, shape.head_dim):
        return "v1"
    if shape.num_partitions > 1:
        return "v2"
    return "v1" if shape.batch * shape.kv_heads < CUDA_FILL_BLOCKS else "v2"


def plan(shape: DecodeShape, variant: str, v1_simdgroups: int = V1_SIMDGROUPS,
         v2_simdgroups: int = V2_SIMDGROUPS, lse: bool = False) -> list[Launch]:
    """The launches of one decode call, in order (``lse``: the ``_lse`` twins, whose last
    launch writes a float32 output and the ``[B, q_heads]`` log-sum-exp)."""
    s = shape
    common = (("T", s.dtype), ("D", s.head_dim), ("BS", s.block_size), ("WINDOW", s.window),
              ("HQ", s.q_heads), ("HKV", s.kv_heads))
    prefix, quant = ("q", (("KBITS", s.kbits), ("VBITS", s.vbits), ("GS", s.group_size))
                     ) if s.kbits else ("", ())
    out = (s.batch, s.q_heads, s.head_dim)
    outs, dtypes, tail = (((out, out[:2]), (mx.float32, mx.float32), "_lse") if lse
                          else ((out,), (s.dtype,), ""))
    if variant == "v1":
        t = 32 * v1_simdgroups
        return [Launch(prefix + "v1" + tail, common + (("NSG", v1_simdgroups),) + quant,
                       (s.q_heads * t, s.batch, 1), (t, 1, 1), outs, dtypes)]
    assert variant == "v2", variant
    t, p = 32 * v2_simdgroups, s.num_partitions
    rows = (s.batch, s.q_heads, p)
    return [
        Launch(prefix + "v2", common + (("NSG", v2_simdgroups), ("PART", PARTITION_SIZE))
               + quant,
               (s.kv_heads * t, s.batch, p), (t, 1, 1), (rows + (s.head_dim,), rows, rows),
               (mx.float32, mx.float32, mx.float32)),
        Launch("reduce" + tail, (("T", s.dtype), ("D", s.head_dim), ("HQ", s.q_heads)),
               (s.q_heads * s.head_dim, s.batch, 1), (s.head_dim, 1, 1), outs, dtypes),
    ]


def decode_inputs(q: mx.array, kv: PagedKV, shape: DecodeShape) -> list[mx.array]:
    """The kernel inputs, in ``INPUT_NAMES`` (``QUANT_INPUT_NAMES``) order; ``meta`` is the
    second to last."""
    i32 = mx.int32
    key_start = mx.zeros((shape.batch,), i32) if kv.key_start is None else kv.key_start
    meta = mx.array([shape.max_blocks, shape.num_partitions], dtype=i32)
    pools = [a for c in (kv.key_cache, kv.value_cache)
             for a in (c.arrays if isinstance(c, QuantizedPool) else (c,))]
    return [q.reshape(shape.batch, shape.q_heads, shape.head_dim), *pools,
            kv.block_tables.astype(i32), kv.context_lens.astype(i32),
            kv.query_start.astype(i32), key_start.astype(i32), meta,
            mx.array([kv.scale], dtype=mx.float32)]


def run_decode(get_kernel: Callable[[str], Callable], q: mx.array, kv: PagedKV,
               variant: str | None = None, lse: bool = False,
               choose: Callable[[DecodeShape], str] = choose_variant,
               ) -> mx.array | tuple[mx.array, mx.array]:
    """Decode attention through native kernels; arguments as ``reference.paged_attention``
    with ``L == 1`` (``kv.sinks`` unsupported: the dispatcher sends those calls elsewhere).
    ``get_kernel(kind)`` returns a ``metal_kernel``/``cuda_kernel`` callable; ``choose``
    picks the variant when ``variant`` is None (the back end's rule).

    Returns:
        ``[B, q_heads, 1, head_dim]`` in ``q.dtype``; with ``lse``, as
        ``cascade_reference.paged_attention_lse``: that output in float32 and ``[B, q_heads, 1]``
        float32 log-sum-exps (about ``-3e38`` for a row with no visible key).
    """
    shape = decode_shape(q, kv)
    inputs = decode_inputs(q, kv, shape)
    outs: list[mx.array] = []
    for launch in plan(shape, variant or choose(shape), lse=lse):
        args = inputs if not launch.kind.startswith("reduce") else outs + [inputs[-2]]
        outs = get_kernel(launch.kind)(
            inputs=args, template=list(launch.template), grid=launch.grid,
            threadgroup=launch.threadgroup, output_shapes=list(launch.output_shapes),
            output_dtypes=list(launch.output_dtypes))
    out = outs[0].reshape(shape.batch, shape.q_heads, 1, shape.head_dim)
    return (out, outs[1].reshape(shape.batch, shape.q_heads, 1)) if lse else out
