"""Per-layer paged K/V pools as ``mx.array``s, written through a slot mapping.

Layout per cache entry: ``[num_blocks, kv_heads, block_size, head_dim]``: one block of
one head is contiguous, and gathering a sequence's blocks into ``[B, kv_heads, L, D]`` is one
advanced-index op with no transpose. Measured on the development CPU (Gemma 3 270M shape,
1 KV head, D=256, B=32, 40 blocks): 2.5 ms for the gather against 2.3 ms for the
token-contiguous layout plus a transpose; equal within noise, so this layout stays.

Writes are MLX scatters (``pool[blocks, :, offsets] = kv``) applied in place to the array
object the pool holds, so no other live array references the old buffer and MLX can donate
it instead of copying the pool each step.
"""

from __future__ import annotations

import mlx.core as mx


def block_bytes(shapes: list[tuple[int, int, int]], block_size: int, dtype: mx.Dtype) -> int:
    """Bytes one block takes across all caches, K and V:
    ``sum(block_size * kv_heads * (k_dim + v_dim)) * itemsize`` over ``shapes``
    (``(kv_heads, k_dim, v_dim)`` per cache)."""
    return sum(block_size * h * (dk + dv) for h, dk, dv in shapes) * dtype.size


class PagedKVCache:
    """The only K/V storage of the engine: one K and one V pool per cache entry.

    Each entry (an attention layer, or one loop of a looped layer) has its own geometry, so
    layers with other head counts or head sizes (Gemma 4's global layers) and K/V of
    different widths (MLA's non-absorbed form) each get pools of their own shape.

    Args:
        shapes: ``(kv_heads, k_dim, v_dim)`` per entry; ``kv_heads == 0`` for an entry the
            model never writes (no pool).
        num_blocks: Blocks per pool, the null block 0 included.
        block_size: Tokens per block.
        dtype: Storage dtype.
    """

    def __init__(self, shapes: list[tuple[int, int, int]], num_blocks: int, block_size: int,
                 dtype: mx.Dtype) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.shapes = list(shapes)
        self.key_caches = [mx.zeros((num_blocks, h, block_size, dk), dtype)
                           for h, dk, _ in shapes]
        self.value_caches = [mx.zeros((num_blocks, h, block_size, dv), dtype)
                             for h, _, dv in shapes]
        mx.eval(self.key_caches, self.value_caches)

    def write(self, layer: int, keys: mx.array, values: mx.array, slot_blocks: mx.array,
              slot_offsets: mx.array) -> None:
        """Scatter new K/V into ``layer``'s pools.

        Args:
            layer: Cache entry index.
            keys: ``[B, kv_heads, L, k_dim]`` new keys (RoPE applied).
            values: ``[B, kv_heads, L, v_dim]`` new values.
            slot_blocks: ``[B * L]`` int32 block id of each token (padding: block 0).
            slot_offsets: ``[B * L]`` int32 offset of each token inside its block.

        Raises:
            ValueError: The K/V shape differs from the entry's geometry.
        """
        b, h, n, dk = keys.shape
        dv = values.shape[3]
        if (h, dk, dv) != self.shapes[layer] or values.shape[:3] != keys.shape[:3]:
            raise ValueError(f"cache {layer}: K/V of shape {keys.shape} / {values.shape} do "
                             f"not match the probed geometry {self.shapes[layer]}")
        k = keys.transpose(0, 2, 1, 3).reshape(b * n, h, dk).astype(self.dtype)
        v = values.transpose(0, 2, 1, 3).reshape(b * n, h, dv).astype(self.dtype)
        self.key_caches[layer][slot_blocks, :, slot_offsets] = k
        self.value_caches[layer][slot_blocks, :, slot_offsets] = v

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every pool (copy-on-write after a fork).

        The source blocks are read (evaluated) before the scatter: a scatter whose values
        still read the pool lazily cannot take over the pool's buffer, and MLX would copy
        the whole pool (about a second for a 1 GiB pool on the CPU) instead of the blocks.
        """
        if not pairs:
            return
        src = mx.array([s for s, _ in pairs], dtype=mx.int32)
        dst = mx.array([d for _, d in pairs], dtype=mx.int32)
        pools = [*self.key_caches, *self.value_caches]
        blocks = [pool[src] for pool in pools]
        mx.eval(blocks)
        for pool, values in zip(pools, blocks):
            pool[dst] = values
