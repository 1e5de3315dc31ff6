"""The scheduler's only door to KV memory: prefix hits, slot allocation, caching, free.

Pure Python (no mlx); follows vLLM v1's ``KVCacheManager`` over SGLang's radix tree. It owns
the :class:`BlockPool` and the :class:`RadixCache`; the scheduler never touches reference
counts or tree nodes.

Token ranges of a request when a step is scheduled::

    |<---- prefix hit ---->|<-- computed -->|<--- num_new_tokens --->|
    |  tree's blocks,      |  own blocks    |  written this step     |
    |  forked + locked     |                |                        |
    |<-------------- blocks needed: cdiv(computed + new, block_size) ------------->|

After a step, every newly full block (prompt or generated tokens) is inserted into the tree
(``cache_blocks``); the tree keeps its own reference, so the block stays cached after the
request finishes until LRU eviction needs it. When several requests computed the same block
concurrently, the tree keeps the first and the others keep their duplicates until they finish
(swapping them would rewrite block-table entries the model runner treats as immutable).
"""

from __future__ import annotations

from mlxpa.core.block_pool import BlockPool
from mlxpa.core.radix_cache import PrefixMatch, RadixCache, RadixNode
from mlxpa.request import Request
from mlxpa.utils import cdiv

_NO_HIT = PrefixMatch([], 0, None)


class KVCacheManager:
    """Allocates blocks for requests over one :class:`BlockPool`, sharing cached prefixes.

    Args:
        pool: The block pool.
        enable_prefix_caching: Keep full blocks in a radix tree and reuse them.
    """

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.tree = RadixCache(pool, pool.block_size) if enable_prefix_caching else None
        self._blocks_to_copy: list[tuple[int, int]] = []
        self._locked: dict[Request, RadixNode] = {}
        self._num_cached_blocks: dict[Request, int] = {}
        self.evicted_blocks = 0
        # Each eviction scans the tree's leaves (O(nodes)); evicting at least 1/128 of the
        # pool per call keeps decode steps, which need one block at a time, from scanning a
        # large tree once per request.
        self.evict_batch = max(1, pool.num_blocks // 128)

    @property
    def enable_prefix_caching(self) -> bool:
        return self.tree is not None

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests or the tree."""
        return self.pool.num_usable_blocks - self.pool.num_free_blocks

    @property
    def num_active_blocks(self) -> int:
        """Blocks held by requests: used blocks minus those only the tree holds (unlocked,
        evictable on demand; vLLM counts such cached blocks as free)."""
        evictable = self.tree.evictable_blocks if self.tree is not None else 0
        return self.num_used_blocks - evictable

    @property
    def capacity_tokens(self) -> int:
        """Most tokens one request can ever hold (every usable block)."""
        return self.pool.num_usable_blocks * self.block_size

    def get_computed_blocks(self, req: Request) -> PrefixMatch:
        """Longest cached prefix of ``req``'s tokens, capped at ``num_tokens - 1`` so the
        last token is always computed (its logits are sampled); a scoring request's scored
        tokens and the one before them are computed too (their logits are read)."""
        if self.tree is None:
            return _NO_HIT
        tokens = req.all_token_ids if req.output_token_ids else req.prompt_token_ids
        return self.tree.match_prefix(tokens[:req.num_tokens - 1 - req.num_scored_tokens])

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed: PrefixMatch | None = None) -> list[int] | None:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens after its computed ones.

        Evicts unlocked tree leaves (LRU) when free blocks run short.

        Args:
            req: The request; its ``block_table`` grows in place.
            num_new_tokens: Tokens to be written this step.
            computed: A prefix hit from :meth:`get_computed_blocks` on admission.

        Returns:
            The newly allocated block ids, or None when even after eviction the pool lacks
            free blocks (nothing changes; the scheduler preempts someone and retries).
        """
        computed = computed or _NO_HIT
        num_tokens = req.num_computed_tokens + computed.num_tokens + num_new_tokens
        need = max(cdiv(num_tokens, self.block_size) - len(req.block_table)
                   - len(computed.block_ids), 0)
        cow = self._needs_cow(req)
        if computed.last_node is not None:
            self.tree.lock(computed.last_node)  # protect the hit from the eviction below
        short = need + cow - self.pool.num_free_blocks
        if short > 0 and self.tree is not None:
            self.evicted_blocks += self.tree.evict(max(short, self.evict_batch))
        if need + cow > self.pool.num_free_blocks:
            if computed.last_node is not None:
                self.tree.unlock(computed.last_node)
            return None
        if computed.last_node is not None:
            self._adopt_lock(req, computed.last_node)
            self._num_cached_blocks[req] = len(computed.block_ids)
        if computed.block_ids:
            req.block_table.extend(self.pool.fork(computed.block_ids))
        if cow:
            pair = self.pool.copy_on_write(req.block_table,
                                           req.num_computed_tokens // self.block_size)
            assert pair is not None
            self._blocks_to_copy.append(pair)
        new = self.pool.allocate(need)
        req.block_table.extend(new)
        return new

    def _needs_cow(self, req: Request) -> bool:
        if req.num_computed_tokens % self.block_size == 0:
            return False
        idx = req.num_computed_tokens // self.block_size
        return idx < len(req.block_table) and self.pool.ref_cnt(req.block_table[idx]) > 1

    def _lock_for(self, req: Request, node: RadixNode) -> None:
        """Lock ``node`` and make it the tree node ``req`` keeps locked."""
        self.tree.lock(node)
        self._adopt_lock(req, node)

    def _adopt_lock(self, req: Request, node: RadixNode) -> None:
        """Make ``node`` (already locked for ``req``) the node ``req`` keeps locked, unlocking
        the one it kept before."""
        old = self._locked.pop(req, None)
        if old is not None:
            self.tree.unlock(old)
        self._locked[req] = node

    def cache_blocks(self, req: Request) -> None:
        """Insert ``req``'s newly full blocks (prompt and generated tokens) into the tree.

        Cost is paid only when a block boundary was crossed (amortized O(1) per step)."""
        if self.tree is None:
            return
        full = req.num_computed_tokens // self.block_size
        if full <= self._num_cached_blocks.get(req, 0):
            return
        n = full * self.block_size
        tokens = req.all_token_ids[:n] if n > req.num_prompt_tokens else (
            req.prompt_token_ids[:n])
        self.tree.insert(tokens, req.block_table[:full])
        self._lock_for(req, self.tree.match_prefix(tokens).last_node)
        self._num_cached_blocks[req] = full

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        """``(src, dst)`` copies queued by copy-on-write since the last call."""
        pairs, self._blocks_to_copy = self._blocks_to_copy, []
        return pairs

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks, tail first, so its last blocks are reused first; blocks
        also held by the tree stay cached."""
        node = self._locked.pop(req, None)
        if node is not None:
            self.tree.unlock(node)
        self._num_cached_blocks.pop(req, None)
        self.pool.free(reversed(req.block_table))
        req.block_table = []

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share ``parent``'s prompt blocks (n > 1 samples of one prompt)."""
        child.block_table = self.pool.fork(
            parent.block_table[:cdiv(parent.num_prompt_tokens, self.block_size)])
        node = self._locked.get(parent)
        if node is not None:
            self._lock_for(child, node)
            self._num_cached_blocks[child] = self._num_cached_blocks[parent]

    def check_invariants(self, requests: list[Request]) -> None:
        """Assert every block's ``ref_cnt`` equals its holders (requests and the tree)."""
        holders = [r.block_table for r in requests]
        if self.tree is not None:
            self.tree.check_invariants()
            holders.append(self.tree.blocks())
        self.pool.check_invariants(holders)


__all__ = ["KVCacheManager"]
