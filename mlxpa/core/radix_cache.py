"""Block-granular radix tree of cached prompt prefixes: match, insert, lock, LRU evict.

SGLang's RadixAttention cache (``radix_cache.py``) at block granularity, in SGLang's names: a
node's ``key`` is a run of token ids whose length is a multiple of ``block_size``, its ``value``
holds one block id per block of the key, and a child is indexed by its first block's tokens.

Ownership of a request's prompt blocks around the tree::

    |<------ hit (match_prefix) ------>|<---- own blocks (allocate) ---->|
    |  tree's blocks, forked + locked  |  written by the model          |
    after insert(): |<---------- tree holds one reference of every full block ----------->|

The tree holds one :class:`BlockPool` reference of each of its blocks. :meth:`evict` drops it,
so an evicted block becomes free only once no request holds it any more.

NOTE: unlike SGLang, :meth:`evict` trims the LRU leaf from its tail end instead of always
dropping whole nodes, so it releases exactly the blocks asked for and keeps the rest of a long
leaf cached. Only blocks no other node depends on are dropped, so the tree stays consistent.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

from mlxpa.core.block_pool import BlockPool


@dataclass(eq=False, slots=True)
class RadixNode:
    """One edge of the tree: ``len(key) == len(value) * block_size`` (the root's are empty).

    Attributes:
        node_id: Creation order within its cache (breaks LRU ties; shown by ``pretty_print``).
        key: Token ids of this edge.
        value: Block ids holding ``key``'s K/V, one per block.
        parent: None for the root.
        children: Child nodes by the first block of their key.
        lock_ref: Requests using this node or a descendant; > 0 protects it from eviction.
        last_access_time: Tick of the cache's monotone clock at the last match or insert.
    """

    node_id: int
    key: tuple[int, ...] = ()
    value: list[int] = field(default_factory=list)
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: int = 0


class PrefixMatch(NamedTuple):
    """A prefix hit: ``block_ids`` hold the K/V of the first ``num_tokens`` tokens; lock
    ``last_node`` while using them (None: no tree, no hit)."""

    block_ids: list[int]
    num_tokens: int
    last_node: RadixNode | None = None


class RadixCache:
    """Prefix tree over full KV blocks with reference-counted sharing and LRU eviction.

    Args:
        pool: The block pool whose references the tree holds, or None for a simulated tree
            (no reference counting; block ids are made up when not given) used for planning
            and ordering.
        block_size: Tokens per block.

    Raises:
        ValueError: ``block_size < 1`` or it differs from ``pool.block_size``.
    """

    def __init__(self, pool: BlockPool | None, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if pool is not None and pool.block_size != block_size:
            raise ValueError(f"block_size {block_size} != pool.block_size {pool.block_size}")
        self.pool = pool
        self.block_size = block_size
        self._clear()

    def reset(self) -> None:
        """Empty the tree, dropping its pool reference of every block. Nodes held by requests
        become stale: drop those handles rather than unlocking them."""
        if self.pool is not None:
            self.pool.free(b for node in self._nodes() for b in reversed(node.value))
        self._clear()

    def _clear(self) -> None:
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self._sim_block_ids = itertools.count(1)
        self.root = RadixNode(next(self._ids))
        self.evictable_blocks = self.protected_blocks = 0

    @property
    def total_blocks(self) -> int:
        return self.evictable_blocks + self.protected_blocks

    def _child_key(self, token_ids: tuple[int, ...] | list[int], pos: int) -> tuple[int, ...]:
        return tuple(token_ids[pos:pos + self.block_size])

    def _common_blocks(self, key: tuple[int, ...], token_ids: list[int], pos: int) -> int:
        bs, n = self.block_size, 1  # the first block matched through the children index
        while n * bs < len(key) and tuple(token_ids[pos + n * bs:pos + (n + 1) * bs]) == \
                key[n * bs:(n + 1) * bs]:
            n += 1
        return n

    def _split(self, child: RadixNode, num_blocks: int) -> RadixNode:
        """Cut ``child`` after ``num_blocks`` blocks; returns the new upper node."""
        cut = num_blocks * self.block_size
        assert child.parent is not None and 0 < cut < len(child.key)
        new = RadixNode(next(self._ids), child.key[:cut], child.value[:num_blocks], child.parent,
                        lock_ref=child.lock_ref, last_access_time=child.last_access_time)
        child.parent.children[child.key[:self.block_size]] = new
        child.key, child.value, child.parent = child.key[cut:], child.value[num_blocks:], new
        new.children[child.key[:self.block_size]] = child
        return new

    def _walk(self, token_ids: list[int]) -> tuple[RadixNode, int, list[int]]:
        """Follow the longest block-aligned match, splitting where it ends inside a node;
        refreshes access times. Returns the last node, matched tokens and their blocks."""
        node, pos, block_ids = self.root, 0, []
        end = len(token_ids) // self.block_size * self.block_size
        while pos < end and (child := node.children.get(self._child_key(token_ids, pos))):
            n = self._common_blocks(child.key, token_ids, pos)
            if n * self.block_size < len(child.key):
                child = self._split(child, n)
            child.last_access_time = next(self._clock)
            block_ids.extend(child.value)
            node, pos = child, pos + len(child.key)
        return node, pos, block_ids

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Longest cached prefix of ``token_ids`` in whole blocks.

        The caller caps ``token_ids`` at ``len(prompt) - 1`` so the last prompt token is always
        computed. No pool references are taken: lock ``last_node``, then fork the blocks.

        Args:
            token_ids: Tokens to look up; a trailing partial block is ignored.

        Returns:
            The matched blocks, their token count and the deepest matched node (the root on a
            miss). A node in which the match ends is split there first.
        """
        node, num_tokens, block_ids = self._walk(token_ids)
        return PrefixMatch(block_ids, num_tokens, node)

    def insert(self, token_ids: list[int], block_ids: list[int] | None = None) -> int:
        """Cache the full blocks of ``token_ids``, held in ``block_ids``.

        The tree takes one pool reference of each newly inserted block. For the prefix it
        already held, the caller should free its own duplicate blocks and use the tree's.

        Args:
            token_ids: Tokens whose K/V are in ``block_ids``; a trailing partial block is ignored.
            block_ids: One block id per block of ``token_ids`` (extra ones are ignored). May be
                None only for a simulated tree, which then numbers new blocks 1, 2, ...

        Returns:
            Tokens (a multiple of ``block_size``) the tree already held before this call.

        Raises:
            ValueError: Too few ``block_ids``, or none given to a tree over a pool.
        """
        num_blocks = len(token_ids) // self.block_size
        if block_ids is None and self.pool is not None:
            raise ValueError("block_ids are required when the tree holds pool references")
        if block_ids is not None and len(block_ids) < num_blocks:
            raise ValueError(f"{len(token_ids)} tokens need {num_blocks} blocks, "
                             f"got {len(block_ids)}")
        node, present, _ = self._walk(token_ids)
        first = present // self.block_size
        if first < num_blocks:
            value = (list(block_ids[first:num_blocks]) if block_ids is not None
                     else [next(self._sim_block_ids) for _ in range(first, num_blocks)])
            new = RadixNode(next(self._ids), tuple(token_ids[present:num_blocks * self.block_size]),
                            value, node, last_access_time=next(self._clock))
            node.children[new.key[:self.block_size]] = new
            if self.pool is not None:
                self.pool.incref(value)
            self.evictable_blocks += len(value)
        return present

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its ancestors from eviction (SGLang ``inc_lock_ref``)."""
        while node is not self.root:
            assert node.parent is not None
            if node.lock_ref == 0:
                self.evictable_blocks -= len(node.value)
                self.protected_blocks += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one :meth:`lock` of ``node`` (SGLang ``dec_lock_ref``)."""
        while node is not self.root:
            assert node.parent is not None and node.lock_ref > 0, node
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_blocks += len(node.value)
                self.protected_blocks -= len(node.value)
            node = node.parent

    def evict(self, num_blocks: int) -> int:
        """Drop up to ``num_blocks`` unlocked blocks, least recently used leaves first.

        A leaf loses its blocks tail first; an emptied leaf is removed and its parent becomes a
        candidate. The tree's pool reference of each block is released, so a block still held
        by a request stays allocated.

        Args:
            num_blocks: Blocks to evict.

        Returns:
            Blocks evicted: ``min(num_blocks, evictable_blocks)``.
        """
        # NOTE: leaves are collected per call (O(nodes)), as SGLang's ``_collect_leaves`` does.
        heap = [(n.last_access_time, n.node_id, n) for n in self._nodes()
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_blocks and heap:
            _, _, leaf = heapq.heappop(heap)
            k = min(num_blocks - evicted, len(leaf.value))
            dropped = leaf.value[len(leaf.value) - k:]
            if self.pool is not None:
                self.pool.free(reversed(dropped))
            evicted += k
            self.evictable_blocks -= k
            if k < len(leaf.value):
                leaf.key, leaf.value = leaf.key[:-k * self.block_size], leaf.value[:-k]
                continue
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[:self.block_size]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.node_id, parent))
        return evicted

    def _nodes(self) -> list[RadixNode]:
        """Every node but the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        """Assert the tree is consistent.

        Raises:
            AssertionError: A key/value size mismatch, a mis-indexed child, a negative lock
                count, a lock count below its children's sum, evictable/protected counts that
                disagree with the nodes, a block in two nodes, or a block without a pool
                reference.
        """
        bs, evictable, protected, seen = self.block_size, 0, 0, set()
        for node in [self.root, *self._nodes()]:
            assert node.lock_ref >= 0, node
            for k, child in node.children.items():
                assert child.parent is node and k == child.key[:bs], (k, child)
            if node is self.root:
                assert not node.key and not node.value and node.lock_ref == 0
                continue
            assert node.key and len(node.key) == len(node.value) * bs, node
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), node
            if node.lock_ref:
                protected += len(node.value)
            else:
                evictable += len(node.value)
            for b in node.value:
                assert b not in seen, f"block {b} in two nodes"
                seen.add(b)
                assert self.pool is None or self.pool.ref_cnt(b) >= 1, (b, node)
        assert (evictable, protected) == (self.evictable_blocks, self.protected_blocks), \
            ((evictable, protected), (self.evictable_blocks, self.protected_blocks))

    def blocks(self) -> list[int]:
        """Every block id in the tree (the tree's holder list for pool invariants)."""
        return [b for node in self._nodes() for b in node.value]

    def pretty_print(self) -> str:
        """The tree as indented lines: first block of each key, blocks, lock_ref, access time."""
        lines = [f"root evictable={self.evictable_blocks} protected={self.protected_blocks}"]
        stack = [(c, 1) for c in reversed(self.root.children.values())]
        while stack:
            node, depth = stack.pop()
            more = f"+{len(node.key) - self.block_size}" if len(node.key) > self.block_size else ""
            lines.append(f"{'  ' * depth}{list(node.key[:self.block_size])}{more} "
                         f"blocks={node.value} lock={node.lock_ref} t={node.last_access_time}")
            stack.extend((c, depth + 1) for c in reversed(node.children.values()))
        return "\n".join(lines)

