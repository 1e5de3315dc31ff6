"""The scheduler's only door to KV memory: block tables, slot allocation, copy-on-write, free.

Pure Python (no mlx); follows vLLM v1's ``KVCacheManager``. It owns the :class:`BlockPool`
and decides which blocks a request's tokens live in; the scheduler never touches reference
counts.

Token ranges of a request when a step is scheduled::

    |<---------- num_computed_tokens ---------->|<--- num_new_tokens --->|
    |  K/V already in blocks (incl. prefix hit)  |  written this step     |
    |<------------------ blocks needed: cdiv(computed + new, block_size) ->|
"""

from __future__ import annotations

from typing import NamedTuple

from mlxpa.block_pool import BlockPool, NoFreeBlocksError
from mlxpa.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ComputedBlocks(NamedTuple):
    """A prefix hit: blocks whose K/V already hold the first ``num_tokens`` prompt tokens."""

    block_ids: list[int]
    num_tokens: int


class KVCacheManager:
    """Allocates blocks for requests over one :class:`BlockPool`.

    Args:
        pool: The block pool.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self._blocks_to_copy: list[tuple[int, int]] = []

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_usable_blocks - self.pool.num_free_blocks

    @property
    def capacity_tokens(self) -> int:
        """Most tokens one request can ever hold (every usable block)."""
        return self.pool.num_usable_blocks * self.block_size

    def get_computed_blocks(self, req: Request) -> ComputedBlocks:
        """Longest cached prefix of ``req``'s prompt (no prefix cache yet: always empty)."""
        return ComputedBlocks([], 0)

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed: ComputedBlocks | None = None) -> list[int] | None:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens after its computed ones.

        Args:
            req: The request; its ``block_table`` grows in place.
            num_new_tokens: Tokens to be written this step.
            computed: A prefix hit from :meth:`get_computed_blocks` on first admission.

        Returns:
            The newly allocated block ids, or None when the pool lacks free blocks (nothing
            changes; the scheduler preempts someone and retries).
        """
        computed = computed or ComputedBlocks([], 0)
        num_tokens = req.num_computed_tokens + computed.num_tokens + num_new_tokens
        have = len(req.block_table) + len(computed.block_ids)
        need = cdiv(num_tokens, self.block_size) - have
        # The block being appended to may be shared after a fork: it needs its own copy.
        cow = self._needs_cow(req)
        if max(need, 0) + cow > self.pool.num_free_blocks:
            return None
        if computed.block_ids:
            req.block_table.extend(self.pool.fork(computed.block_ids))
        if cow:
            idx = req.num_computed_tokens // self.block_size
            pair = self.pool.copy_on_write(req.block_table, idx)
            assert pair is not None
            self._blocks_to_copy.append(pair)
        new = self.pool.allocate(need) if need > 0 else []
        req.block_table.extend(new)
        return new

    def _needs_cow(self, req: Request) -> bool:
        if req.num_computed_tokens % self.block_size == 0:
            return False
        idx = req.num_computed_tokens // self.block_size
        return idx < len(req.block_table) and self.pool.ref_cnt(req.block_table[idx]) > 1

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        """``(src, dst)`` copies queued by copy-on-write since the last call."""
        pairs, self._blocks_to_copy = self._blocks_to_copy, []
        return pairs

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks, tail first, so its last blocks are reused first."""
        self.pool.free(reversed(req.block_table))
        req.block_table = []

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share every block ``parent`` holds (n > 1 samples of one prompt)."""
        child.block_table = self.pool.fork(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens

    def check_invariants(self, requests: list[Request]) -> None:
        """Assert every block's ``ref_cnt`` equals the number of requests holding it."""
        self.pool.check_invariants([r.block_table for r in requests])


__all__ = ["ComputedBlocks", "KVCacheManager", "NoFreeBlocksError", "cdiv"]
