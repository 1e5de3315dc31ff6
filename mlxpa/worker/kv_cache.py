"""Per-layer-slot paged K/V pools as ``mx.array``s, written through a slot mapping.

A block is a column of layer slots (:mod:`mlxpa.core.kv_cache_groups`): slot ``j`` of block
``b`` holds the K/V of the ``j``-th layer of whichever KV cache group owns ``b``. Layout per
slot: ``[num_blocks, kv_heads, block_size, head_dim]``: one block of one head is contiguous,
and gathering a sequence's blocks into ``[B, kv_heads, L, D]`` is one advanced-index op with
no transpose. Measured on the development CPU (Gemma 3 270M shape,
1 KV head, D=256, B=32, 40 blocks): 2.5 ms for the gather against 2.3 ms for the
token-contiguous layout plus a transpose; equal within noise, so this layout stays.

A quantized entry (``--kv-cache-dtype int8|int4|k8v4``) holds each pool as a
:class:`~mlxpa.kernels.quant.QuantizedPool`: three arrays of the same layout, the last axis
``D * bits / 32`` packed words and ``D / group_size`` scales and biases per token (mlx-lm's
``QuantizedKVCache`` format). A write quantizes each new token's K/V (``mx.quantize``) and
scatters the three arrays at its slot; a token is quantized once, when the step that computes
it writes it, so a block is never re-quantized, and a block copy (copy-on-write) copies its
scales and biases with its values.

Writes are MLX scatters (``pool[blocks, :, offsets] = kv``) applied in place to the array
objects the pool holds, so no other live array references the old buffers and MLX can donate
them instead of copying the pool each step.

The pool's size follows the block pool's (:mod:`mlxpa.core.block_pool`'s segments):
:meth:`PagedKVCache.resize` copies every array into one of the new size, one array at a time
and each evaluated before the next, so the transient peak is the pool plus one array (never
two pools); then MLX's buffer cache is cleared, so what a smaller pool gives up goes back to
the system (RSS), not into MLX's cache for later arrays.

A recurrent snapshot is stored as raw bytes across a few whole blocks (every array's row of
the block, in order: :meth:`PagedKVCache.write_bytes`); a model without K/V gets one raw
``uint32`` array for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import mlx.core as mx

from mlxpa.kernels import quant
from mlxpa.kernels.quant import QuantizedPool


class PoolSpec(NamedTuple):
    """One cache entry's pools.

    Attributes:
        kv_heads: K/V heads (0: the entry is never written; no pool).
        k_dim: Width of one key head.
        v_dim: Width of one value head.
        k_bits: Bits per stored key element (0: the pool's dtype, unquantized).
        v_bits: Bits per stored value element (0: unquantized).
        group_size: Elements sharing one scale and bias (quantized pools).
    """

    kv_heads: int
    k_dim: int
    v_dim: int
    k_bits: int = 0
    v_bits: int = 0
    group_size: int = 64

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.kv_heads, self.k_dim, self.v_dim

    def token_bytes(self, dtype: mx.Dtype) -> int:
        """Bytes one token takes in this entry's K and V pools (all heads)."""
        def row(dim: int, bits: int) -> int:
            return (quant.row_bytes(dim, bits, self.group_size, dtype) if bits
                    else dim * dtype.size)
        return self.kv_heads * (row(self.k_dim, self.k_bits) + row(self.v_dim, self.v_bits))


def block_bytes(specs: Iterable[PoolSpec], block_size: int, dtype: mx.Dtype) -> int:
    """Bytes one block takes across all entries, K and V, counted from the stored layout:
    ``block_size * sum(spec.token_bytes(dtype))`` (``dim * itemsize`` per unquantized head row,
    ``dim * bits / 8`` plus two scales per group for a quantized one)."""
    return block_size * sum(s.token_bytes(dtype) for s in specs)


def _pool(num_blocks: int, heads: int, block_size: int, dim: int, bits: int, group_size: int,
          dtype: mx.Dtype) -> mx.array | QuantizedPool:
    shape = (num_blocks, heads, block_size, dim)
    return quant.zeros(shape, bits, group_size, dtype) if bits else mx.zeros(shape, dtype)


def _arrays(pool: mx.array | QuantizedPool) -> tuple[mx.array, ...]:
    return pool.arrays if isinstance(pool, QuantizedPool) else (pool,)


@mx.compile
def _finite(x: mx.array) -> mx.array:
    """``x`` with NaN and +-inf replaced by 0 (same shape and dtype; one fused pass).

    Attention zeroes the probability of every key a row does not see, but ``0 * NaN`` is
    NaN: non-finite K/V one request wrote (a model overflowing on its input, or a value past
    a half-precision pool's range) would reach other requests through the slots past their
    context in a reused block, and through the null block that padding tokens write and
    padded table entries read. Stored finite, they cannot; a finite value is stored as is.
    """
    return mx.where(mx.isfinite(x), x, mx.zeros_like(x))


class PagedKVCache:
    """The only K/V storage of the engine: one K and one V pool per layer slot.

    Each slot (one layer of every KV cache group, or with one group an attention layer or
    one loop of a looped layer) has its own geometry, so layers with other head counts or
    head sizes (Gemma 4's global layers) and K/V of different widths (MLA's non-absorbed
    form) each get pools of their own shape; each slot is stored in ``dtype`` or quantized
    (:class:`PoolSpec`).

    Args:
        specs: One :class:`PoolSpec` per slot (a ``(kv_heads, k_dim, v_dim)`` tuple: an
            unquantized slot).
        num_blocks: Blocks per pool, the null block 0 included.
        block_size: Tokens per block.
        dtype: Storage dtype of unquantized pools, and of quantized pools' scales and biases.
        state_block_bytes: With no slot: the bytes of a block of the raw snapshot array
            (a model without K/V; a multiple of 4; 0: none).

    Attributes:
        key_caches, value_caches: Per slot, the pool: an ``mx.array`` or a
            :class:`QuantizedPool` (``mx.eval`` evaluates either).
        state_pool: ``[num_blocks, state_block_bytes / 4]`` uint32 raw blocks, or None.
        raw_blocks: Blocks whose bytes :meth:`write_bytes` laid over the K/V pools (a
            recurrent snapshot, a block read from disk) and no K/V write has cleared since
            (:meth:`clear_raw`).
    """

    def __init__(self, specs: Iterable[PoolSpec | tuple[int, int, int]], num_blocks: int,
                 block_size: int, dtype: mx.Dtype, state_block_bytes: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.specs = [PoolSpec(*s) for s in specs]
        self.key_caches = [_pool(num_blocks, s.kv_heads, block_size, s.k_dim, s.k_bits,
                                 s.group_size, dtype) for s in self.specs]
        self.value_caches = [_pool(num_blocks, s.kv_heads, block_size, s.v_dim, s.v_bits,
                                   s.group_size, dtype) for s in self.specs]
        self.state_pool = (mx.zeros((num_blocks, state_block_bytes // 4), mx.uint32)
                           if state_block_bytes and not self.specs else None)
        self.raw_blocks: set[int] = set()
        mx.eval(self.arrays())

    @property
    def shapes(self) -> list[tuple[int, int, int]]:
        """``(kv_heads, k_dim, v_dim)`` per entry."""
        return [s.shape for s in self.specs]

    def arrays(self) -> list[mx.array]:
        """Every array of every pool (what a step evaluates after its writes)."""
        pools = [a for p in (*self.key_caches, *self.value_caches) for a in _arrays(p)]
        return pools if self.state_pool is None else [*pools, self.state_pool]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block over every array."""
        return sum(a.nbytes // a.shape[0] for a in self.arrays())

    def write_bytes(self, blocks: list[int], data: mx.array) -> None:
        """Store raw bytes in whole blocks: ``data`` (uint8, ``len(blocks) * block_nbytes``
        bytes) split into one run per block, each laid over the block's row of every array
        in :meth:`arrays` order (a recurrent snapshot)."""
        k = len(blocks)
        ids = mx.array(blocks, dtype=mx.int32)
        data = data.reshape(k, -1)
        off = 0
        for a in self.arrays():
            row = a.nbytes // a.shape[0]
            part = mx.contiguous(data[:, off:off + row])
            a[ids] = part.view(a.dtype).reshape(k, *a.shape[1:])
            off += row
        if self.specs:  # only K/V pools are ever read as K/V (a state pool never is)
            self.raw_blocks.update(blocks)

    def clear_raw(self, blocks: Iterable[int]) -> None:
        """Zero those of ``blocks`` that hold raw bytes (:attr:`raw_blocks`), in every array,
        before K/V are first written there. Read as K/V, a snapshot's bytes can be NaN or
        inf in a half-precision pool (the low half of a finite float32), and the slots past
        a request's context in its last block keep them: ``0 * NaN`` would reach its output
        (see :func:`_finite`)."""
        reused = self.raw_blocks.intersection(blocks)
        if not reused:
            return
        ids = mx.array(sorted(reused), dtype=mx.int32)
        for a in self.arrays():
            a[ids] = mx.zeros((len(reused), *a.shape[1:]), a.dtype)
        self.raw_blocks -= reused

    def read_bytes(self, blocks: list[int]) -> mx.array:
        """The bytes :meth:`write_bytes` stored in ``blocks``, as one uint8 array (lazy)."""
        ids = mx.array(blocks, dtype=mx.int32)
        k = len(blocks)
        return mx.concatenate([a[ids].reshape(k, -1).view(mx.uint8) for a in self.arrays()],
                              axis=1).reshape(-1)

    @property
    def nbytes(self) -> int:
        """Bytes of all pools, null block included."""
        return sum(a.nbytes for a in self.arrays())

    def resize(self, num_blocks: int) -> None:
        """Hold ``num_blocks`` blocks (null block included) in every array: the first
        ``min(old, new)`` blocks keep their contents, new ones are zero (a block id at or
        above ``num_blocks`` must not be in use)."""
        if num_blocks == self.num_blocks:
            return

        def resized(a: mx.array) -> mx.array:
            if num_blocks < a.shape[0]:
                new = mx.contiguous(a[:num_blocks])  # a copy: the old buffer is freed
            else:  # one allocation (a concatenation with zeros takes two; measured slower)
                new = mx.pad(a, [(0, num_blocks - a.shape[0])] + [(0, 0)] * (a.ndim - 1))
            mx.eval(new)
            return new

        for pools in (self.key_caches, self.value_caches):
            for i in range(len(pools)):  # in place: each old array goes once its copy is made
                pools[i] = pools[i].map(resized) if isinstance(pools[i], QuantizedPool) else (
                    resized(pools[i]))
        if self.state_pool is not None:
            self.state_pool = resized(self.state_pool)
        self.num_blocks = num_blocks
        self.raw_blocks = {b for b in self.raw_blocks if b < num_blocks}
        mx.clear_cache()

    def write(self, layer: int, keys: mx.array, values: mx.array, slot_blocks: mx.array,
              slot_offsets: mx.array) -> None:
        """Scatter new K/V into ``layer``'s pools (quantizing them for a quantized slot);
        NaN and +-inf are stored as 0 (:func:`_finite`).

        Args:
            layer: Layer slot index.
            keys: ``[B, kv_heads, L, k_dim]`` new keys (RoPE applied).
            values: ``[B, kv_heads, L, v_dim]`` new values.
            slot_blocks: ``[B * L]`` int32 block id of each token (padding: block 0).
            slot_offsets: ``[B * L]`` int32 offset of each token inside its block.

        Raises:
            ValueError: The K/V shape differs from the entry's geometry.
        """
        b, h, n, dk = keys.shape
        dv = values.shape[3]
        spec = self.specs[layer]
        if (h, dk, dv) != spec.shape or values.shape[:3] != keys.shape[:3]:
            raise ValueError(f"cache {layer}: K/V of shape {keys.shape} / {values.shape} do "
                             f"not match the probed geometry {spec.shape}")
        for pool, new, bits in ((self.key_caches[layer], keys, spec.k_bits),
                                (self.value_caches[layer], values, spec.v_bits)):
            rows = _finite(new.transpose(0, 2, 1, 3).reshape(b * n, h, -1).astype(self.dtype))
            stored = quant.quantize(rows, bits, spec.group_size) if bits else rows
            for array, part in zip(_arrays(pool), _arrays(stored)):
                array[slot_blocks, :, slot_offsets] = part

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every pool, scales and biases included
        (copy-on-write after a fork).

        The source blocks are read (evaluated) before the scatter: a scatter whose values
        still read the pool lazily cannot take over the pool's buffer, and MLX would copy
        the whole pool (about a second for a 1 GiB pool on the CPU) instead of the blocks.
        """
        if not pairs:
            return
        src = mx.array([s for s, _ in pairs], dtype=mx.int32)
        dst = mx.array([d for _, d in pairs], dtype=mx.int32)
        arrays = self.arrays()
        blocks = [array[src] for array in arrays]
        mx.eval(blocks)
        for array, values in zip(arrays, blocks):
            array[dst] = values
        for s, d in pairs:
            (self.raw_blocks.add if s in self.raw_blocks else self.raw_blocks.discard)(d)
