"""KV block pool: block ids, reference counts, free queues, fork and copy-on-write, and a size
that grows and shrinks in segments.

Pure Python (no mlx). Follows vLLM v1's ``BlockPool`` and nano-vllm's ``BlockManager``:
block ids are ints, block 0 is a null block that is never handed out (padded slots write
there), and a block returns to a free queue when its reference count reaches zero.
Requests free their blocks in reverse order, so their tail blocks are reused first.

Segments: the ids ``[k * segment_blocks, (k + 1) * segment_blocks)`` form segment ``k`` (the
last one cut at the ceiling, ``max_num_blocks``); the pool holds its first ``num_segments``
of them (the worker's arrays have ``num_blocks`` rows). Each held segment has its own free
queue, and :meth:`BlockPool.allocate` takes from the lowest segment with a free block, so
requests fill the bottom of the pool and the top segments drain when the load falls:
:meth:`BlockPool.grow` adds segments, :meth:`BlockPool.shrink` gives back free ones at the top
(after :meth:`BlockPool.relocate` moved what was held there lower down). A pool of one segment
(the default) behaves as a fixed pool with one free queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from mlxpa.utils import cdiv

NULL_BLOCK = 0


class NoFreeBlocksError(RuntimeError):
    """Raised by :meth:`BlockPool.allocate` when fewer blocks are free than asked for."""


class BlockPool:
    """KV blocks of ``block_size`` tokens each, held in segments up to a ceiling.

    Args:
        num_blocks: The most blocks the pool may hold (its ceiling, ``max_num_blocks``),
            the null block 0 included (so ``num_blocks - 1`` can be handed out).
        block_size: Tokens per block.
        segment_blocks: Blocks per segment (None: one segment of ``num_blocks``, a fixed
            pool); at least 2 (the first segment holds the null block and one more).
        initial_blocks: Blocks held at first, rounded up to whole segments (None: all).

    Raises:
        ValueError: ``num_blocks < 2``, ``block_size < 1`` or ``segment_blocks < 2``.
    """

    def __init__(self, num_blocks: int, block_size: int, segment_blocks: int | None = None,
                 initial_blocks: int | None = None) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if segment_blocks is not None and segment_blocks < 2:
            raise ValueError(f"segment_blocks must be >= 2, got {segment_blocks}")
        self.max_num_blocks = num_blocks
        self.block_size = block_size
        self.segment_blocks = min(segment_blocks or num_blocks, num_blocks)
        self._ref_cnt = [0] * num_blocks
        self._free: list[deque[int]] = []  # per held segment, its free blocks
        self._num_free = 0
        self._group = [0] * num_blocks  # the KV cache group a block was allocated for
        self._used: dict[int, int] = {}  # blocks in use per group
        self.num_blocks = 0  # blocks held now, the null block included
        self.grow(num_blocks if initial_blocks is None else initial_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can be handed out now (all held but the null block)."""
        return self.num_blocks - 1

    @property
    def max_usable_blocks(self) -> int:
        """Blocks that can be handed out once the pool holds its ceiling."""
        return self.max_num_blocks - 1

    @property
    def num_segments(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the blocks held now that are in use, in [0, 1]."""
        return 1.0 - self._num_free / self.num_usable_blocks

    def size_for(self, num_blocks: int) -> int:
        """The pool's size holding at least ``num_blocks`` blocks (null included): whole
        segments, at least one, at most the ceiling."""
        segments = max(1, cdiv(num_blocks, self.segment_blocks))
        return min(segments * self.segment_blocks, self.max_num_blocks)

    def grow(self, num_blocks: int) -> int:
        """Hold at least ``num_blocks`` blocks (whole segments, at most the ceiling); the new
        blocks are free. Returns the blocks added (0: the pool held as many already)."""
        new, old = self.size_for(num_blocks), self.num_blocks
        if new <= old:
            return 0
        s = self.segment_blocks
        for k in range(len(self._free), cdiv(new, s)):
            ids = range(max(k * s, 1), min((k + 1) * s, new))
            self._free.append(deque(ids))
            self._num_free += len(ids)
        self.num_blocks = new
        return new - old

    def shrink(self, num_blocks: int) -> int:
        """Give back the segments above ``num_blocks`` blocks (rounded up to whole
        segments); every block there must be free. Returns the blocks given back.

        Raises:
            RuntimeError: A block above the new size is in use (:meth:`relocate` first).
        """
        new, old = self.size_for(num_blocks), self.num_blocks
        if new >= old:
            return 0
        held = [b for b in range(new, old) if self._ref_cnt[b]]
        if held:
            raise RuntimeError(f"cannot shrink the pool to {new} blocks: blocks {held[:8]} "
                               "are in use")
        for queue in self._free[cdiv(new, self.segment_blocks):]:
            self._num_free -= len(queue)
        del self._free[cdiv(new, self.segment_blocks):]
        self.num_blocks = new
        return old - new

    def relocate(self, limit: int) -> dict[int, int]:
        """Move every block in use at or above id ``limit`` (a segment boundary) to a free
        block below it: the new block takes the old one's reference count and group, the
        old one is free. The caller copies the contents (``src -> dst``) and renames the
        holders.

        Returns:
            ``{src: dst}`` for each block moved.

        Raises:
            NoFreeBlocksError: Fewer blocks are free below ``limit`` than are in use above it
                (nothing moves).
        """
        assert limit % self.segment_blocks == 0 or limit >= self.num_blocks, limit
        srcs = [b for b in range(limit, self.num_blocks) if self._ref_cnt[b]]
        below = sum(map(len, self._free[:cdiv(limit, self.segment_blocks)]))
        if len(srcs) > below:
            raise NoFreeBlocksError(f"{len(srcs)} blocks in use above block {limit}, "
                                    f"{below} free below it")
        moves = {}
        for src in srcs:
            dst = self._take()
            assert dst < limit, (dst, limit)
            self._ref_cnt[dst], self._group[dst] = self._ref_cnt[src], self._group[src]
            self._ref_cnt[src] = 0
            self._put(src)
            moves[src] = dst
        return moves

    def _take(self) -> int:
        """The head of the lowest segment's free queue with a block."""
        queue = next(q for q in self._free if q)
        self._num_free -= 1
        return queue.popleft()

    def _put(self, block: int) -> None:
        self._free[block // self.segment_blocks].append(block)
        self._num_free += 1

    def free_queue(self) -> list[int]:
        """The free blocks in the order :meth:`allocate` hands them out."""
        return [b for queue in self._free for b in queue]

    def allocate(self, n: int, group: int = 0) -> list[int]:
        """Take ``n`` blocks, each with ``ref_cnt`` 1, for KV cache group ``group`` (counted
        in :meth:`used_by_group`): from the head of the lowest segment's free queue first.

        Raises:
            NoFreeBlocksError: Fewer than ``n`` blocks are free (nothing is taken).
        """
        if n > self._num_free:
            raise NoFreeBlocksError(f"asked for {n} blocks, {self._num_free} free")
        ids = [self._take() for _ in range(n)]
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
        """Drop one reference of each block; blocks reaching zero join their segment's free
        queue at the tail, in the order given."""
        for b in ids:
            assert b != NULL_BLOCK and self._ref_cnt[b] > 0, (b, self._ref_cnt[b])
            self._ref_cnt[b] -= 1
            if self._ref_cnt[b] == 0:
                self._put(b)
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
                queues or in another segment's, held above the pool's size, has a negative
                count, or the counts disagree with ``holders``.
        """
        order = self.free_queue()
        free = set(order)
        assert len(free) == len(order) == self._num_free, "duplicate block in free queue"
        assert free <= set(range(1, self.num_blocks)), "foreign id in free queue"
        assert all(b // self.segment_blocks == k for k, q in enumerate(self._free) for b in q), \
            "block in another segment's free queue"
        assert self.num_blocks == self.size_for(self.num_blocks) and len(self._free) == cdiv(
            self.num_blocks, self.segment_blocks), (self.num_blocks, len(self._free))
        assert self._ref_cnt[NULL_BLOCK] == 0
        for b in range(1, self.max_num_blocks):
            rc = self._ref_cnt[b]
            assert rc >= 0, (b, rc)
            if b >= self.num_blocks:
                assert rc == 0, f"block {b} above the pool's {self.num_blocks}: ref_cnt {rc}"
                continue
            assert (rc == 0) == (b in free), f"block {b}: ref_cnt {rc}, free={b in free}"
        used: dict[int, int] = {}
        for b in range(1, self.num_blocks):
            if self._ref_cnt[b]:
                used[self._group[b]] = used.get(self._group[b], 0) + 1
        assert used == {g: n for g, n in self._used.items() if n}, (used, self._used)
        if holders is not None:
            counts = [0] * self.max_num_blocks
            for table in holders:
                for b in table:
                    counts[b] += 1
            assert counts == self._ref_cnt, "ref counts differ from holders"
