"""KV block pool: block ids, reference counts, a free queue, fork and copy-on-write.

Pure Python (no mlx). Follows vLLM v1's ``BlockPool`` and nano-vllm's ``BlockManager``:
block ids are ints, block 0 is a null block that is never handed out (padded slots write
there), and a block returns to the free queue when its reference count reaches zero.
Requests free their blocks in reverse order, so their tail blocks are reused first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

NULL_BLOCK = 0


class NoFreeBlocksError(RuntimeError):
    """Raised by :meth:`BlockPool.allocate` when fewer blocks are free than asked for."""


class BlockPool:
    """Fixed set of ``num_blocks`` KV blocks of ``block_size`` tokens each.

    Args:
        num_blocks: Blocks in the pool, including the null block 0 (so ``num_blocks - 1``
            can be handed out).
        block_size: Tokens per block.

    Raises:
        ValueError: ``num_blocks < 2`` or ``block_size < 1``.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_cnt = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._group = [0] * num_blocks  # the KV cache group a block was allocated for
        self._used: dict[int, int] = {}  # blocks in use per group

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - 1

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_usable_blocks

    def allocate(self, n: int, group: int = 0) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, each with ``ref_cnt`` 1, for
        KV cache group ``group`` (counted in :meth:`used_by_group`).

        Raises:
            NoFreeBlocksError: Fewer than ``n`` blocks are free (nothing is taken).
        """
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(n)]
        for b in ids:
            assert self._ref_cnt[b] == 0, (b, self._ref_cnt[b])
            self._ref_cnt[b] = 1
            self._group[b] = group
        if n:
            self._used[group] = self._used.get(group, 0) + n
        return ids

    def used_by_group(self, num_groups: int) -> list[int]:
        """Blocks in use for each of groups ``0 .. num_groups - 1``."""
        return [self._used.get(g, 0) for g in range(num_groups)]

    def incref(self, ids: Iterable[int]) -> None:
        for b in ids:
            assert b != NULL_BLOCK and self._ref_cnt[b] > 0, (b, self._ref_cnt[b])
            self._ref_cnt[b] += 1

    def free(self, ids: Iterable[int]) -> None:
        """Drop one reference of each block; blocks reaching zero join the free queue's tail
        in the order given."""
        for b in ids:
            assert b != NULL_BLOCK and self._ref_cnt[b] > 0, (b, self._ref_cnt[b])
            self._ref_cnt[b] -= 1
            if self._ref_cnt[b] == 0:
                self._free.append(b)
                self._used[self._group[b]] -= 1

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def fork(self, block_table: list[int]) -> list[int]:
        """Share every block of ``block_table`` with a new owner; returns the child's table."""
        self.incref(block_table)
        return list(block_table)

    def copy_on_write(self, block_table: list[int], index: int) -> tuple[int, int] | None:
        """Make ``block_table[index]`` exclusively owned before it is written.

        When the block is shared (``ref_cnt > 1``), a fresh block replaces it in
        ``block_table`` (in place) and one reference of the old block is dropped.

        Returns:
            ``(src, dst)`` block ids whose contents the model runner must copy, or None when
            the block was not shared.

        Raises:
            NoFreeBlocksError: The block is shared and no block is free (the caller preempts).
        """
        src = block_table[index]
        if self._ref_cnt[src] <= 1:
            return None
        (dst,) = self.allocate(1, self._group[src])
        self._ref_cnt[src] -= 1
        block_table[index] = dst
        return src, dst

    def check_invariants(self, holders: Iterable[Iterable[int]] | None = None) -> None:
        """Assert the pool is consistent; with ``holders`` (every block table and the tree's
        blocks), also that each block's ``ref_cnt`` equals the number of its holders.

        Raises:
            AssertionError: A block is both free and referenced, listed twice in the free
                queue, has a negative count, or the counts disagree with ``holders``.
        """
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate block in free queue"
        assert free <= set(range(1, self.num_blocks)), "foreign id in free queue"
        assert self._ref_cnt[NULL_BLOCK] == 0
        for b in range(1, self.num_blocks):
            rc = self._ref_cnt[b]
            assert rc >= 0, (b, rc)
            assert (rc == 0) == (b in free), f"block {b}: ref_cnt {rc}, free={b in free}"
        used: dict[int, int] = {}
        for b in range(1, self.num_blocks):
            if self._ref_cnt[b]:
                used[self._group[b]] = used.get(self._group[b], 0) + 1
        assert used == {g: n for g, n in self._used.items() if n}, (used, self._used)
        if holders is not None:
            counts = [0] * self.num_blocks
            for table in holders:
                for b in table:
                    counts[b] += 1
            assert counts == self._ref_cnt, "ref counts differ from holders"
