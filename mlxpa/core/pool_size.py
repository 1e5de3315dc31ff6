"""How many blocks the KV pool holds: it grows by segments when a step needs blocks, and gives
its top segments back when the engine has been idle.

Pure Python (no mlx); the KV cache manager's and the scheduler's side of a pool that follows
the load (mlx_lm.server grows its caches as requests need them; ollama unloads an idle model
after ``keep_alive``; llama.cpp bounds its prompt cache with ``--cache-ram``). The worker only
applies the size the step carries (``SchedulerOutput.num_kv_blocks``) and the block copies of
a compaction.

Growth (:func:`grow_for`): when a step lacks ``short`` free blocks and the pool is below its
ceiling, it grows before anything cached is evicted, by whole segments and by at least half of
what it holds. Growing copies the held blocks into larger arrays, so a pool that grows one
segment at a time to the ceiling would copy ``segments / 2`` pools in all; growing by half
bounds it at three ceilings' worth, at most ``log1.5(segments)`` growths.

Release (:func:`compact`), only while no request holds a block::

    before:  | seg 0: tree blocks, free | seg 1: tree, free | seg 2: tree, free |
    1. evict least recently used tree blocks until the rest fit below the new size
    2. move the tree blocks held above it to free blocks below (block copies, ids renamed)
    after:   | seg 0: the most recently used tree blocks, free |  (segs 1, 2 given back)
"""

from __future__ import annotations

from mlxpa.core.block_pool import BlockPool
from mlxpa.core.radix_cache import RadixCache


def grow_for(pool: BlockPool, short: int) -> int:
    """Grow ``pool`` for ``short`` more free blocks: by whole segments, by at least half of
    the blocks it holds, at most to its ceiling. Returns the blocks added (0: at the
    ceiling)."""
    if short <= 0 or pool.num_blocks >= pool.max_num_blocks:
        return 0
    return pool.grow(pool.num_blocks + max(short, pool.num_blocks // 2))


def compact(pool: BlockPool, tree: RadixCache | None, num_blocks: int
            ) -> tuple[list[tuple[int, int]], int]:
    """Shrink ``pool`` to ``num_blocks`` (whole segments, at least one) while only ``tree``
    holds blocks: the tree keeps its most recently used blocks that fit, moved below the new
    size, and drops the rest.

    Returns:
        The ``(src, dst)`` block copies to apply before the worker's arrays shrink, and the
        blocks evicted.

    Raises:
        RuntimeError: A block is held by something other than the tree (a request).
    """
    size = pool.size_for(num_blocks)
    held = pool.num_usable_blocks - pool.num_free_blocks
    cached = tree.total_blocks if tree is not None else 0
    if held != cached or (tree is not None and tree.protected_blocks):
        raise RuntimeError("the KV pool shrinks only while no request holds a block")
    evicted = tree.evict(cached - (size - 1)) if cached > size - 1 else 0
    moves = pool.relocate(size)
    if tree is not None:
        tree.remap(moves)
    pool.shrink(size)
    return list(moves.items()), evicted


__all__ = ["compact", "grow_for"]
