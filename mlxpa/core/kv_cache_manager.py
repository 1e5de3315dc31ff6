"""The scheduler's only door to KV memory: prefix hits, slot allocation, caching, free, over
KV cache groups, with recurrent snapshots.

Pure Python (no mlx); follows vLLM v1's ``KVCacheManager`` and its hybrid coordinator over
SGLang's radix tree. It owns the :class:`BlockPool` and the :class:`RadixCache`; the
scheduler never touches reference counts or tree nodes. Each request has one block table per
KV cache group (:mod:`mlxpa.core.kv_cache_groups`), position-indexed: entry ``i`` holds
tokens ``[i * block_size, (i + 1) * block_size)``.

Token ranges of a request when a step is scheduled (every group)::

    |<---- prefix hit ---->|<-- computed -->|<--- num_new_tokens --->|
    |  tree's blocks,      |  own blocks    |  written this step     |
    |  forked + locked     |                |                        |
    |<-------------- blocks needed: cdiv(computed + new, block_size) ------------->|

A sliding-window group's table starts with ``NULL_BLOCK`` entries: after every step the
blocks entirely before ``num_computed_tokens - window + 1`` (no query reads them again) go
back (vLLM's ``remove_skipped_blocks``); the tree may keep them cached until evicted.

After a step, every newly full block (prompt or generated tokens) is inserted into the tree
(``cache_blocks``); the tree keeps its own reference, so the block stays cached after the
request finishes until LRU eviction needs it. When several requests computed the same block
concurrently, the tree keeps the first and the others keep their duplicates until they finish
(swapping them would rewrite block-table entries the model runner treats as immutable).

Requests with different ``cache_salt`` never share a block: the tree is looked up and filled
in each request's salt's namespace, and a fork (same request id) keeps its parent's salt.

Recurrent layers (hybrid and state-space models) keep a live state per request in the worker;
snapshots of it at the positions other requests resume from (a shared prefix's end, a fork's
start) take blocks of the same pool (:mod:`mlxpa.core.snapshots`).
"""

from __future__ import annotations

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool
from mlxpa.core.disk_cache import DiskStore
from mlxpa.core.kv_cache_groups import KVCacheGroupSpec, KVCacheLayout
from mlxpa.core.kv_disk import DiskTier, KVLoad, KVSave, supports_disk_tier
from mlxpa.core.pool_size import compact, grow_for
from mlxpa.core.radix_cache import PrefixMatch, RadixCache, RadixNode
from mlxpa.core.snapshots import Snapshots, StateOp
from mlxpa.request import Request
from mlxpa.utils import cdiv


class KVCacheManager:
    """Allocates blocks for requests over one :class:`BlockPool`, sharing cached prefixes.

    Args:
        pool: The block pool.
        enable_prefix_caching: Keep full blocks in a radix tree and reuse them.
        layout: The KV cache groups (None: one full-attention group).
    """

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True,
                 layout: KVCacheLayout | None = None) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.layout = layout or KVCacheLayout(pool.block_size,
                                              (KVCacheGroupSpec(None, (0,)),), 1)
        if self.layout.block_size != pool.block_size:
            raise ValueError(f"layout block_size {self.layout.block_size} != pool block_size "
                             f"{pool.block_size}")
        self.windows = self.layout.windows
        self.num_groups = len(self.windows)
        self.recurrent = bool(self.layout.recurrent)
        self.tree = (RadixCache(pool, pool.block_size, self.windows, self.recurrent)
                     if enable_prefix_caching else None)
        self._blocks_to_copy: list[tuple[int, int]] = []
        # by request key: the tree node it keeps locked, its blocks in the tree, per sliding
        # group its first live table entry
        self._locked: dict[int, RadixNode] = {}
        self._num_cached_blocks: dict[int, int] = {}
        self._first_held: dict[int, list[int]] = {}
        self.evicted_blocks = 0
        self.snapshots = Snapshots(pool, self.tree, self.layout.snapshot_blocks,
                                   self.num_groups)
        self.disk: DiskTier | None = None

    def attach_disk(self, store: DiskStore) -> bool:
        """Put the disk tier ``store`` under the radix tree (:mod:`mlxpa.core.kv_disk`);
        returns False (no tier) without prefix caching or for a model without K/V."""
        if self.tree is None or not supports_disk_tier(self.layout):
            return False
        self.disk = DiskTier(store, self.tree, self.pool, self.layout)
        return True

    @property
    def evict_batch(self) -> int:
        """Each eviction scans the tree's leaves (O(nodes)); evicting at least 1/128 of the
        pool per call keeps decode steps, which need one block at a time, from scanning a
        large tree once per request."""
        return max(1, self.pool.num_blocks // 128)

    @property
    def enable_prefix_caching(self) -> bool:
        return self.tree is not None

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests or the tree."""
        return self.pool.num_usable_blocks - self.pool.num_free_blocks

    @property
    def num_active_blocks(self) -> int:
        """Blocks held by requests: used blocks minus those the tree may drop (unlocked or
        idle, evictable on demand; vLLM counts such cached blocks as free)."""
        evictable = self.tree.evictable_blocks if self.tree is not None else 0
        return self.num_used_blocks - evictable

    def blocks_to_finish(self, req: Request, chunk: int, outputs: int | None = None) -> int:
        """Blocks ``req`` still needs, over every group, to reach ``outputs`` output tokens
        (default its ``max_tokens``) computing at most ``chunk`` tokens a step (window groups
        at their cap; the blocks it holds counted off; snapshots not included)."""
        held = sum(b != NULL_BLOCK for table in req.block_tables for b in table)
        outputs = req.max_tokens if outputs is None else outputs
        total = self.layout.blocks_needed(req.num_prompt_tokens + outputs, chunk)
        return max(total - held, 0)

    def memory_hit(self, req: Request) -> PrefixMatch | None:
        """The prefix hit of :meth:`get_computed_blocks` in the memory tier alone, without
        planning disk reads (None without prefix caching)."""
        if self.tree is None:
            return None
        return self.tree.match_prefix(_hit_tokens(req), req.cache_salt)

    def held_hit_blocks(self, hit: PrefixMatch | None) -> int:
        """Full-attention blocks of ``hit`` that running requests hold already (its last node
        is locked: none of them is free or evictable), so starting the request that hit takes
        no block for them; 0 when the hit's blocks are the tree's alone (they are among the
        available blocks, and the hit takes them)."""
        if hit is None or hit.last_node is None or not hit.last_node.lock_ref:
            return 0
        return sum(b != NULL_BLOCK for g, w in enumerate(self.windows) if w is None
                   for b in hit.block_ids[g])

    def spare_blocks(self, running: list[Request], req: Request) -> int:
        """Blocks a prefill chunk of ``req`` may hold for one step past what the window cap
        lets it (:meth:`KVCacheLayout.chunk_for_spare`): available (free, the pool's growth up
        to its budget, blocks only the prefix cache holds: evicted LRU, as vLLM's free queue
        hands out cached free blocks) and not needed by ``req`` or any of ``running`` to reach
        its ``max_tokens`` at the cap (negative: none). Window blocks a chunk leaves behind
        stay cached, so counting only free blocks would cap every later chunk once the pool
        is full of them."""
        cap = self.layout.max_chunk_tokens or 1
        need = self.blocks_to_finish(req, cap) + sum(
            self.blocks_to_finish(r, cap if r.num_tokens - r.num_computed_tokens > 1 else 1)
            for r in running if r is not req)
        return self.num_available_blocks - need

    @property
    def num_available_blocks(self) -> int:
        """Free blocks, those only the prefix cache holds (evictable on demand) and those the
        pool may still grow by."""
        pool = self.pool
        return (pool.num_free_blocks + pool.max_num_blocks - pool.num_blocks
                + (self.tree.evictable_blocks if self.tree else 0))

    def active_blocks_by_group(self) -> list[int]:
        """:attr:`num_active_blocks` per group, then for recurrent snapshots."""
        used = self.pool.used_by_group(self.num_groups + 1)
        if self.tree is None:
            return used
        return [u - e for u, e in zip(used, self.tree.evictable)]

    def held_tokens_and_slots(self, reqs: list[Request], ends: list[int]) -> tuple[int, int]:
        """Over ``reqs`` (whose K/V reach ``ends``) and every group: tokens whose K/V their
        blocks hold, and the token slots of those blocks (KV utilisation's two sums)."""
        tokens = slots = 0
        for req, end in zip(reqs, ends):
            first = self._first_held.get(req.key)
            for g, table in enumerate(req.block_tables):
                skipped = first[g] if first else 0
                tokens += max(end - skipped * self.block_size, 0)
                slots += (len(table) - skipped) * self.block_size
        return tokens, slots

    def held_bytes(self, block_bytes: int, live_state_bytes: int) -> dict[str, int]:
        """Bytes of KV held now per kind of group (:meth:`KVCacheLayout.group_kinds`): the
        blocks requests hold and the tree must keep, at ``block_bytes`` each; ``recurrent``
        adds the requests' live states (``live_state_bytes``), when the model has any."""
        held: dict[str, int] = {}
        for kind, blocks in zip(self.layout.group_kinds(), self.active_blocks_by_group()):
            held[kind] = held.get(kind, 0) + blocks * block_bytes
        if self.recurrent:
            held["recurrent"] += live_state_bytes
        else:
            del held["recurrent"]
        return held

    @property
    def capacity_tokens(self) -> int:
        """Most tokens one request can ever hold: ``n`` blocks of tokens, the largest whose
        blocks in every group (:meth:`KVCacheLayout.blocks_needed`) fit the usable blocks (a
        model without a full-attention group: unbounded once they fit; a snapshot that does
        not fit is not saved)."""
        usable = self.pool.max_usable_blocks
        chunk = 1  # a request alone computes as few tokens a step as it must (Scheduler)

        def fits(n: int) -> bool:
            return self.layout.blocks_needed(n * self.block_size, chunk) <= usable

        if not fits(1):
            return 0
        if None not in self.windows:
            return 1 << 40
        lo, hi = 1, usable + 1  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo * self.block_size

    # ------------------------------------------------------------------ prefix hits

    def get_computed_blocks(self, req: Request, memory: PrefixMatch | None = None
                            ) -> PrefixMatch:
        """Longest usable cached prefix of ``req``'s tokens under its ``cache_salt``, capped at
        ``num_tokens - 1`` so the last token is always computed (its logits are sampled); a
        scoring request's scored tokens and the one before them are computed too (their
        logits are read). ``memory``: its :meth:`memory_hit`, when already looked up (the
        tree unchanged since), extended from the disk tier here."""
        if self.tree is None:
            return PrefixMatch([[] for _ in self.windows], 0, None)
        tokens = _hit_tokens(req)
        match = memory if memory is not None else self.tree.match_prefix(tokens, req.cache_salt)
        return match if self.disk is None else self.disk.extend(req, tokens, match)

    def cached_prefix_blocks(self, tokens: list[int], cache_salt: str | None = None) -> int:
        """Full blocks of ``tokens`` whose K/V the tree holds under ``cache_salt`` in every
        full-attention group, usable or not (where a recurrent model's next snapshot would
        pay)."""
        return 0 if self.tree is None else self.tree.num_cached_blocks(tokens, cache_salt)

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed: PrefixMatch | None = None) -> list[list[int]] | None:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens after its computed ones, in
        every group, and a snapshot's blocks when the step ends at one of its snapshot points.

        Evicts blocks the tree alone holds (LRU) when free blocks run short.

        Args:
            req: The request; its ``block_tables`` grow in place.
            num_new_tokens: Tokens to be written this step.
            computed: A prefix hit from :meth:`get_computed_blocks` on admission.

        Returns:
            The newly allocated block ids per group, or None when even after eviction the
            pool lacks free blocks (nothing changes; the scheduler preempts someone and
            retries).
        """
        hit = computed if computed is not None and computed.num_tokens else None
        start = req.num_computed_tokens + (hit.num_tokens if hit else 0)
        end = start + num_new_tokens
        tables = req.block_tables or [[] for _ in self.windows]
        need = self._new_blocks(tables, end, hit)
        cow = [] if hit else [g for g in range(self.num_groups) if self._needs_cow(req, g)]
        snap = self.layout.snapshot_blocks if self.snapshots.due(req, end) else 0
        total = sum(need) + len(cow)
        held = self._hold(hit) if hit else []  # protect the hit from the eviction below
        short = total + snap - self.pool.num_free_blocks
        short -= grow_for(self.pool, short)  # a pool below its ceiling grows before evicting
        if short > 0 and self.tree is not None:
            self.evicted_blocks += self.tree.evict(max(short, self.evict_batch))
        if total + snap > self.pool.num_free_blocks:  # a snapshot never preempts anyone
            snap = 0
        if total > self.pool.num_free_blocks:
            if hit:
                self._free_blocks(held)
                if hit.last_node is not None:
                    self.tree.unlock(hit.last_node)
            return None
        req.block_tables = tables
        if hit:
            self._adopt_hit(req, hit)
        for g in cow:
            index = req.num_computed_tokens // self.block_size
            pair = self.pool.copy_on_write(req.block_tables[g], index)
            assert pair is not None
            self._release([pair[0]])
            self._blocks_to_copy.append(pair)
        new = [self.pool.allocate(n, g) for g, n in enumerate(need)]
        for table, ids in zip(req.block_tables, new):
            table.extend(ids)
        if snap:
            self.snapshots.save(req, end)
        self.snapshots.start(req)
        return new

    def _new_blocks(self, tables: list[list[int]], end: int,
                    hit: PrefixMatch | None = None) -> list[int]:
        """Per group, the blocks a request with ``tables`` (and a prefix ``hit`` about to be
        adopted) still lacks to hold tokens up to ``end``."""
        return [max(cdiv(end, self.block_size) - len(t)
                    - (len(hit.block_ids[g]) if hit else 0), 0) for g, t in enumerate(tables)]

    def _hold(self, hit: PrefixMatch) -> list[int]:
        """Lock ``hit``'s node and take a reference of its blocks and snapshot, so no
        eviction drops them (a sliding window's, a snapshot, are droppable in a locked
        node); returns the blocks taken."""
        if hit.last_node is not None:
            self.tree.lock(hit.last_node)
        held = [b for ids in hit.block_ids for b in ids if b != NULL_BLOCK]
        if self.recurrent and hit.snapshot:
            held += hit.snapshot
        self.pool.incref(held)
        self._acquire(held)
        return held

    def _adopt_hit(self, req: Request, hit: PrefixMatch) -> None:
        """Make ``hit``'s blocks (held: :meth:`_hold`) ``req``'s first blocks, and its
        snapshot the state ``req`` resumes from."""
        if hit.last_node is not None:
            self._adopt_lock(req, hit.last_node)
            self._num_cached_blocks[req.key] = hit.num_tokens // self.block_size
        if self.disk is not None:
            self.disk.adopted(req, hit)
        for table, ids in zip(req.block_tables, hit.block_ids):
            table.extend(ids)
        if self.recurrent and hit.snapshot:
            self.snapshots.resume_from(req, hit.snapshot)

    def _needs_cow(self, req: Request, group: int) -> bool:
        if req.num_computed_tokens % self.block_size == 0 or not req.block_tables:
            return False
        idx = req.num_computed_tokens // self.block_size
        table = req.block_tables[group]
        return idx < len(table) and table[idx] != NULL_BLOCK and self.pool.ref_cnt(
            table[idx]) > 1

    def _release(self, blocks: list[int]) -> None:
        """After a request dropped its reference of ``blocks``: the tree's may go idle."""
        if self.tree is not None:
            self.tree.release(blocks)

    def _acquire(self, blocks: list[int]) -> None:
        if self.tree is not None:
            self.tree.acquire(blocks)

    def _shared_node(self, req: Request, node: RadixNode) -> RadixNode:
        """The deepest node at or above ``node`` whose last block ``req`` holds (its first
        group's): below it the tree keeps blocks another request computed, which ``req``
        holds duplicates of and must not keep from eviction."""
        tree = self.tree
        table = req.block_tables[0] if self.num_groups else []
        while node.parent is not None:  # up to its namespace's root
            end = tree._end(node) - 1
            if end < len(table) and node.value[0][-1] == table[end] != NULL_BLOCK:
                return node
            node = node.parent
        return node

    def _lock_for(self, req: Request, node: RadixNode) -> None:
        """Lock ``node`` and make it the tree node ``req`` keeps locked."""
        self.tree.lock(node)
        self._adopt_lock(req, node)

    def _adopt_lock(self, req: Request, node: RadixNode) -> None:
        """Make ``node`` (already locked for ``req``) the node ``req`` keeps locked, unlocking
        the one it kept before."""
        old = self._locked.pop(req.key, None)
        if old is not None:
            self.tree.unlock(old)
        self._locked[req.key] = node

    # ------------------------------------------------------------------ after a step

    def cache_blocks(self, req: Request) -> None:
        """After a step of ``req``: insert its newly full blocks (prompt and generated tokens)
        into the tree, file the snapshot saved at its end, release the blocks its windows
        left and the snapshot it resumed from.

        Cost is paid only when a block boundary was crossed (amortized O(1) per step)."""
        full = req.num_computed_tokens // self.block_size
        if self.tree is not None and full > self._num_cached_blocks.get(req.key, 0):
            n = full * self.block_size
            tokens = req.all_token_ids[:n] if n > req.num_prompt_tokens else (
                req.prompt_token_ids[:n])
            self.tree.insert(tokens, [t[:full] for t in req.block_tables],
                             self._num_cached_blocks.get(req.key, 0), req.cache_salt)
            self._lock_for(req, self._shared_node(req, self.tree.node_for(tokens,
                                                                          req.cache_salt)))
            self._num_cached_blocks[req.key] = full
        if self.recurrent:
            self._free_blocks(self.snapshots.after_step(req))
        self._remove_skipped_blocks(req)

    def _remove_skipped_blocks(self, req: Request) -> None:
        """Free ``req``'s sliding-window blocks no query reads again (vLLM's
        ``remove_skipped_blocks``): those before ``num_computed_tokens - window + 1``."""
        if not req.block_tables:
            return
        first = self._first_held.setdefault(req.key, [0] * self.num_groups)
        for g, w in enumerate(self.windows):
            if w is None:
                continue
            stop = min(max(0, req.num_computed_tokens - w + 1) // self.block_size,
                       len(req.block_tables[g]))
            table, freed = req.block_tables[g], []
            for i in range(first[g], stop):
                if table[i] != NULL_BLOCK:
                    freed.append(table[i])
                    table[i] = NULL_BLOCK
            first[g] = max(first[g], stop)
            if freed:
                self._free_blocks(freed)

    def _free_blocks(self, blocks: list[int]) -> None:
        """Drop a request's reference of ``blocks`` (the tree's may go idle)."""
        self.pool.free(reversed(blocks))
        self._release(blocks)

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        """``(src, dst)`` copies queued by copy-on-write since the last call."""
        pairs, self._blocks_to_copy = self._blocks_to_copy, []
        return pairs

    def take_disk_ops(self) -> tuple[list[KVSave], list[KVLoad]]:
        """The disk tier's block saves and loads queued since the last call."""
        return self.disk.take() if self.disk is not None else ([], [])

    def take_state_ops(self) -> tuple[list[StateOp], list[StateOp]]:
        """The recurrent snapshots queued since the last call: ``(request, blocks)`` to save
        each request's state into after the step, and to restore its state from before."""
        return self.snapshots.take()

    # ------------------------------------------------------------------ snapshot points

    def add_snapshot_point(self, req: Request, position: int, fork: bool = False) -> None:
        """Save ``req``'s recurrent state at ``position`` when its computation reaches it
        (:meth:`Snapshots.add_point`); nothing without recurrent layers."""
        if self.recurrent:
            self.snapshots.add_point(req, position, fork)

    def snapshot_points(self, req: Request) -> list[int]:
        return self.snapshots.points(req)

    def chunk_limit(self, req: Request, start: int, spare_blocks: int = 0) -> int | None:
        """Most tokens ``req``'s next chunk, from position ``start``, may compute: up to its
        next snapshot point, at most the layout's chunk cap, or past the cap as far as
        ``spare_blocks`` (:meth:`spare_blocks`) pays for (None: no limit)."""
        limit = (self.layout.max_chunk_tokens if spare_blocks <= 0
                 else self.layout.chunk_for_spare(spare_blocks))
        point = self.snapshots.next_point(req, start)
        if point is None:
            return limit
        return point - start if limit is None else min(point - start, limit)

    def can_fork(self, parent: Request, position: int) -> bool:
        """Whether a request forked from ``parent`` can start at ``position`` (a recurrent
        model needs the parent's snapshot there)."""
        return not self.recurrent or self.snapshots.fork_blocks(parent, position) is not None

    # ------------------------------------------------------------------ free and fork

    def free(self, req: Request) -> None:
        """Release ``req``'s blocks, tail first, so its last blocks are reused first; blocks
        also held by the tree stay cached."""
        node = self._locked.pop(req.key, None)
        if node is not None:
            self.tree.unlock(node)
        if self.disk is not None:
            self.disk.forget(req)
        self._num_cached_blocks.pop(req.key, None)
        self._first_held.pop(req.key, None)
        for table in req.block_tables:
            self._free_blocks([b for b in table if b != NULL_BLOCK])
        req.block_tables = []
        if self.recurrent:
            self._free_blocks(self.snapshots.drop(req))

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share ``parent``'s prompt blocks (n > 1 samples of one prompt, a
        scoring request after its prompt) and, for a recurrent model, restore the parent's
        fork snapshot (:meth:`can_fork` must hold). Both must have the same ``cache_salt``."""
        assert child.cache_salt == parent.cache_salt, "a fork never crosses cache salts"
        n = cdiv(parent.num_prompt_tokens, self.block_size)
        child.block_tables = [list(t[:n]) for t in parent.block_tables]
        for w, table in zip(self.windows, child.block_tables):
            if w is not None:  # only the child's window (the parent may hold more still)
                first = max(0, child.num_computed_tokens - w + 1) // self.block_size
                table[:first] = [NULL_BLOCK] * min(first, len(table))
        for table in child.block_tables:
            live = [b for b in table if b != NULL_BLOCK]
            self.pool.incref(live)
            self._acquire(live)
        node = self._locked.get(parent.key)
        if node is not None:
            self._lock_for(child, node)
            self._num_cached_blocks[child.key] = self._num_cached_blocks[parent.key]
        if self.recurrent:
            blocks = self.snapshots.fork_blocks(parent, child.num_computed_tokens)
            self.pool.incref(blocks)
            self.snapshots.resume_from(child, blocks)

    # ------------------------------------------------------------------ pool size

    def grow_pool(self, num_blocks: int) -> int:
        """Hold at least ``num_blocks`` blocks (whole segments, at most the ceiling: work
        known to need them); returns the blocks added."""
        return self.pool.grow(num_blocks)

    def shrink_pool(self, num_blocks: int) -> list[tuple[int, int]]:
        """Shrink the pool to ``num_blocks`` (whole segments) while no request holds a block,
        keeping the most recently used cached blocks that fit (:func:`compact`); returns the
        ``(src, dst)`` copies to apply before the worker's arrays shrink."""
        pairs, evicted = compact(self.pool, self.tree, num_blocks)
        self.evicted_blocks += evicted
        return pairs

    def check_invariants(self, requests: list[Request]) -> None:
        """Assert every block's ``ref_cnt`` equals its holders (requests and the tree)."""
        holders = [[b for b in t if b != NULL_BLOCK] for r in requests for t in r.block_tables]
        holders += self.snapshots.holders()
        if self.tree is not None:
            self.tree.check_invariants()
            holders.append(self.tree.blocks())
        self.pool.check_invariants(holders)


__all__ = ["KVCacheManager"]


def _hit_tokens(req: Request) -> list[int]:
    """The tokens a prefix hit of ``req`` may cover: all but its last one, its scored tokens
    and the one before them (their logits are computed)."""
    tokens = req.all_token_ids if req.output_token_ids else req.prompt_token_ids
    return tokens[:req.num_tokens - 1 - req.num_scored_tokens]
