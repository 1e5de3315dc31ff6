"""Per-layer paged K/V pools as ``mx.array``s, written through a slot mapping.

Layout per layer: ``[num_blocks, kv_heads, block_size, head_dim]``: one block of
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


def block_bytes(num_layers: int, block_size: int, kv_heads: int, head_dim: int,
                dtype: mx.Dtype) -> int:
    """Bytes one block takes across all layers, K and V:
    ``2 * layers * block_size * kv_heads * head_dim * itemsize``."""
    return 2 * num_layers * block_size * kv_heads * head_dim * dtype.size


class PagedKVCache:
    """The only K/V storage of the engine: one K and one V pool per layer.

    Args:
        num_layers: Transformer layers.
        num_blocks: Blocks per pool, the null block 0 included.
        block_size: Tokens per block.
        kv_heads: KV heads per layer.
        head_dim: Head dimension.
        dtype: Storage dtype.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, dtype: mx.Dtype) -> None:
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.key_caches = [mx.zeros(shape, dtype) for _ in range(num_layers)]
        self.value_caches = [mx.zeros(shape, dtype) for _ in range(num_layers)]
        mx.eval(self.key_caches, self.value_caches)

    def write(self, layer: int, keys: mx.array, values: mx.array, slot_blocks: mx.array,
              slot_offsets: mx.array) -> None:
        """Scatter new K/V into ``layer``'s pools.

        Args:
            layer: Layer index.
            keys: ``[B, kv_heads, L, head_dim]`` new keys (RoPE applied).
            values: Same shape as ``keys``.
            slot_blocks: ``[B * L]`` int32 block id of each token (padding: block 0).
            slot_offsets: ``[B * L]`` int32 offset of each token inside its block.
        """
        b, h, n, d = keys.shape
        k = keys.transpose(0, 2, 1, 3).reshape(b * n, h, d).astype(self.dtype)
        v = values.transpose(0, 2, 1, 3).reshape(b * n, h, d).astype(self.dtype)
        self.key_caches[layer][slot_blocks, :, slot_offsets] = k
        self.value_caches[layer][slot_blocks, :, slot_offsets] = v

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write after a fork)."""
        if not pairs:
            return
        src = mx.array([s for s, _ in pairs], dtype=mx.int32)
        dst = mx.array([d for _, d in pairs], dtype=mx.int32)
        for pools in (self.key_caches, self.value_caches):
            for pool in pools:
                pool[dst] = pool[src]
