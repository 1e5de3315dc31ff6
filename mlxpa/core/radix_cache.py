"""Block-granular radix tree of cached prompt prefixes over KV cache groups: match, insert,
lock, LRU evict; sliding-window tombstones and recurrent snapshots.

SGLang's RadixAttention cache (``radix_cache.py``) at block granularity, in SGLang's names: a
node's ``key`` is a run of token ids whose length is a multiple of ``block_size``, its
``value`` holds, per KV cache group (:mod:`mlxpa.core.kv_cache_groups`), one block id per
block of the key, and a child is indexed by its first block's tokens. The tree holds one
:class:`BlockPool` reference of each of its blocks.

Three kinds of blocks, after SGLang's SWA and Mamba radix caches and vLLM's hybrid manager:

- a full-attention block is part of the tree's structure: it goes only when its node's tail
  is trimmed (an unlocked leaf, least recently used first);
- a sliding-window block is needed only by a hit that ends less than a window after it, so
  the tree may drop it alone, leaving a *tombstone* (``NULL_BLOCK``) in the node;
- a recurrent *snapshot* (the state after a node's last token, in some blocks of the pool)
  may be dropped alone too.

A droppable block (the last two kinds) held by no request is *idle*; idle blocks are kept in
the order they became idle (a request releasing a block refreshes it, as vLLM's free queue
does), and :meth:`evict` takes the least recently used of an idle block and an unlocked
leaf. A hit (:meth:`match_prefix`) is the longest block-aligned prefix whose full-attention
blocks are all cached, whose sliding-window groups hold the window before its end, and, for a
model with recurrent layers, which ends at a node with a snapshot.

Namespaces (vLLM's ``cache_salt``; TensorRT-LLM mixes the salt into the root of its block
tree): every method that reads or writes the tree takes a ``cache_salt``, and each salt has
its own root, so a request hits only blocks inserted under its salt (None: the unsalted
namespace, :attr:`RadixCache.root`). A salted root is made by the first insert under its
salt and goes when eviction empties it; one LRU order, one eviction, spans every namespace.

NOTE: unlike SGLang, :meth:`evict` trims the LRU leaf from its tail end instead of always
dropping whole nodes, so it releases about the blocks asked for and keeps the rest of a long
leaf cached.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool


@dataclass(eq=False, slots=True)
class RadixNode:
    """One edge of the tree: ``len(key) == len(value[g]) * block_size`` (the root's are empty).

    Attributes:
        node_id: Creation order within its cache (breaks LRU ties; shown by ``pretty_print``).
        cache_salt: The namespace the node belongs to (its root's salt; None: unsalted).
        key: Token ids of this edge.
        value: Per group, the block ids holding ``key``'s K/V, one per block (``NULL_BLOCK``:
            a sliding-window block the tree dropped).
        start: Blocks from the root to this node's first block.
        parent: None for a root (one per namespace).
        children: Child nodes by the first block of their key.
        lock_ref: Requests using this node or a descendant; > 0 protects it from trimming.
        last_access_time: Tick of the cache's monotone clock at the last match or insert.
        snapshot: The blocks of the recurrent state after the node's last token, or None.
        held: Per group, then for the snapshot, the block ids the node holds (tombstones
            excluded).
        idle: Of those, droppable ones no request holds.
        removed: Evicted from the tree (its parent link is kept: a split may have moved
            blocks recorded at it into its ancestors).
    """

    node_id: int
    cache_salt: str | None = None
    key: tuple[int, ...] = ()
    value: list[list[int]] = field(default_factory=list)
    start: int = 0
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: int = 0
    snapshot: list[int] | None = None
    held: list[int] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
    removed: bool = False


class PrefixMatch(NamedTuple):
    """A prefix hit: per group, ``block_ids`` hold the K/V of the first ``num_tokens`` tokens
    (``NULL_BLOCK`` before a sliding window's last window); ``snapshot``, the recurrent state
    there; lock ``last_node`` while using them (None: no tree, or nothing cached under the
    salt: no hit)."""

    block_ids: list[list[int]]
    num_tokens: int
    last_node: RadixNode | None = None
    snapshot: list[int] | None = None


_SNAPSHOT = -1  # the group index of a snapshot's blocks in RadixCache._where


class RadixCache:
    """Prefix tree over full KV blocks with reference-counted sharing and LRU eviction.

    Args:
        pool: The block pool whose references the tree holds, or None for a simulated tree
            (no reference counting; block ids are made up when not given) used for planning
            and ordering.
        block_size: Tokens per block.
        windows: Per KV cache group, its sliding window (None: full attention); ``()`` for a
            model without K/V.
        recurrent: Hits must end at a recurrent snapshot.

    Raises:
        ValueError: ``block_size < 1`` or it differs from ``pool.block_size``.
    """

    def __init__(self, pool: BlockPool | None, block_size: int,
                 windows: Sequence[int | None] = (None,), recurrent: bool = False) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if pool is not None and pool.block_size != block_size:
            raise ValueError(f"block_size {block_size} != pool.block_size {pool.block_size}")
        self.pool = pool
        self.block_size = block_size
        self.windows = tuple(windows)
        self.recurrent = recurrent
        self._sliding = [g for g, w in enumerate(self.windows) if w is not None]
        # Called with (node, index) before blocks of the node at that index leave, or its
        # snapshot (index: the node's last) (a disk tier saves what is worth keeping:
        # mlxpa.core.kv_disk).
        self.on_evict: Callable[[RadixNode, int], None] | None = None
        self._clear()

    def reset(self) -> None:
        """Empty the tree, dropping its pool reference of every block. Nodes held by requests
        become stale: drop those handles rather than unlocking them."""
        if self.pool is not None:
            self.pool.free(b for node in self._nodes() for b in reversed(_held(node)))
        self._clear()

    def _clear(self) -> None:
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self._sim_block_ids = itertools.count(1)
        self.root = self._node(value=[[] for _ in self.windows])  # the unsalted namespace
        self._roots: dict[str, RadixNode] = {}  # salted namespaces' roots, by salt
        # per group, then for snapshots: blocks the tree holds, and those it may drop now
        self.held = [0] * (len(self.windows) + 1)
        self.evictable = [0] * (len(self.windows) + 1)
        # droppable block -> (node holding it or a node below, group or _SNAPSHOT, position)
        self._where: dict[int, tuple[RadixNode, int, int]] = {}
        self._idle: dict[int, int] = {}  # idle droppable block -> tick, oldest first

    def _size(self, node: RadixNode) -> int:
        """Blocks of ``node``'s key."""
        return len(node.key) // self.block_size

    def _end(self, node: RadixNode) -> int:
        """Blocks from the root to ``node``'s end."""
        return node.start + len(node.key) // self.block_size

    def root_of(self, cache_salt: str | None, create: bool = False) -> RadixNode | None:
        """The root of ``cache_salt``'s namespace (:attr:`root` for None); None when nothing
        is cached under that salt, unless ``create``."""
        if cache_salt is None:
            return self.root
        root = self._roots.get(cache_salt)
        if root is None and create:
            root = self._roots[cache_salt] = self._node(cache_salt=cache_salt,
                                                        value=[[] for _ in self.windows])
        return root

    def roots(self) -> list[RadixNode]:
        """Every namespace's root: the unsalted one first, then the salted ones."""
        return [self.root, *self._roots.values()]

    def _node(self, **fields) -> RadixNode:
        g = len(self.windows) + 1
        return RadixNode(next(self._ids), held=[0] * g, idle=[0] * g, **fields)

    @property
    def total_blocks(self) -> int:
        return sum(self.held)

    @property
    def evictable_blocks(self) -> int:
        """Blocks :meth:`evict` can drop now: every block of an unlocked node, and idle
        droppable blocks of locked ones."""
        return sum(self.evictable)

    @property
    def protected_blocks(self) -> int:
        return self.total_blocks - self.evictable_blocks

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    # ------------------------------------------------------------------ match and insert

    def _child_key(self, token_ids: Sequence[int], pos: int) -> tuple[int, ...]:
        return tuple(token_ids[pos:pos + self.block_size])

    def _common_blocks(self, key: tuple[int, ...], token_ids: Sequence[int], pos: int) -> int:
        bs, n = self.block_size, 1  # the first block matched through the children index
        while n * bs < len(key) and tuple(token_ids[pos + n * bs:pos + (n + 1) * bs]) == \
                key[n * bs:(n + 1) * bs]:
            n += 1
        return n

    def _walk(self, token_ids: Sequence[int],
              root: RadixNode | None) -> list[tuple[RadixNode, int]]:
        """The longest block-aligned match below ``root`` as ``(node, blocks of it matched)``
        pairs, root excluded (none without a root); nothing changes."""
        if root is None:
            return []
        node, pos, path = root, 0, []
        end = len(token_ids) // self.block_size * self.block_size
        while pos < end and (child := node.children.get(self._child_key(token_ids, pos))):
            n = self._common_blocks(child.key, token_ids, pos)
            path.append((child, n))
            if n < self._size(child):
                break
            node, pos = child, pos + len(child.key)
        return path

    def _split(self, child: RadixNode, num_blocks: int) -> RadixNode:
        """Cut ``child`` after ``num_blocks`` blocks; returns the new upper node (the lower
        part keeps ``child``'s identity and snapshot)."""
        cut = num_blocks * self.block_size
        assert child.parent is not None and 0 < cut < len(child.key)
        upper = [v[:num_blocks] for v in child.value]
        new = self._node(cache_salt=child.cache_salt, key=child.key[:cut], value=upper,
                         start=child.start, parent=child.parent, lock_ref=child.lock_ref,
                         last_access_time=child.last_access_time)
        child.parent.children[child.key[:self.block_size]] = new
        child.key, child.value, child.parent = child.key[cut:], [
            v[num_blocks:] for v in child.value], new
        child.start += num_blocks
        new.children[child.key[:self.block_size]] = child
        for g, v in enumerate(upper):
            moved = sum(b != NULL_BLOCK for b in v)
            idle = sum(b in self._idle for b in v)
            new.held[g], new.idle[g] = moved, idle
            child.held[g] -= moved
            child.idle[g] -= idle
        return new

    def _cut(self, path: list[tuple[RadixNode, int]], num_blocks: int,
             root: RadixNode) -> RadixNode:
        """The node ending ``num_blocks`` blocks down ``path`` (from ``root``; split there
        when inside a node), every node up to it refreshed; ``root`` when ``num_blocks`` is
        0."""
        node = root
        for child, _ in path:
            if child.start >= num_blocks:
                break
            if self._end(child) > num_blocks:
                child = self._split(child, num_blocks - child.start)
            child.last_access_time = next(self._clock)
            node = child
        return node

    def _usable(self, path: list[tuple[RadixNode, int]]) -> int:
        """Blocks of the longest hit along ``path``: every sliding group holds the window
        before its end, and (recurrent) a snapshot ends it."""
        n = path[-1][0].start + path[-1][1] if path else 0
        if self.recurrent:
            ends = [0] + [self._end(c) for c, k in path if k == self._size(c) and c.snapshot]
        else:
            ends = range(n + 1)
        if not self._sliding:
            return max(ends)
        bs = self.block_size
        last_null = {}  # per sliding group: for each block, the last tombstone at or before
        for g in self._sliding:
            last, marks = -1, []
            for c, k in path:
                for i, b in enumerate(c.value[g][:k]):
                    if b == NULL_BLOCK:
                        last = c.start + i
                    marks.append(last)
            last_null[g] = marks
        for m in sorted(ends, reverse=True):
            if m == 0 or all(last_null[g][m - 1] < max(0, m * bs - self.windows[g] + 1) // bs
                             for g in self._sliding):
                return m
        return 0

    def match_prefix(self, token_ids: Sequence[int],
                     cache_salt: str | None = None) -> PrefixMatch:
        """Longest usable cached prefix of ``token_ids`` in whole blocks, in the namespace of
        ``cache_salt`` (blocks inserted under another salt are never matched).

        The caller caps ``token_ids`` at ``len(prompt) - 1`` so the last prompt token is always
        computed. No pool references are taken: lock ``last_node``, then fork the blocks.

        Args:
            token_ids: Tokens to look up; a trailing partial block is ignored.
            cache_salt: The request's salt (None: the unsalted namespace).

        Returns:
            Per group the matched blocks (a sliding group's ``NULL_BLOCK`` before the window
            of the hit's end), their token count, the deepest matched node (the namespace's
            root on a miss, None when the salt has no namespace; split where the hit ends
            inside a node) and its snapshot.
        """
        root = self.root_of(cache_salt)
        blocks: list[list[int]] = [[] for _ in self.windows]
        if root is None:
            return PrefixMatch(blocks, 0, None)
        path = self._walk(token_ids, root)
        m = self._usable(path)
        node = self._cut(path, m, root)
        walk = []
        while node.parent is not None:
            walk.append(node)
            node = node.parent
        for c in reversed(walk):
            for g, v in enumerate(c.value):
                blocks[g].extend(v)
        for g in self._sliding:
            first = max(0, m * self.block_size - self.windows[g] + 1) // self.block_size
            blocks[g][:first] = [NULL_BLOCK] * first
        last = walk[0] if walk else root
        return PrefixMatch(blocks, m * self.block_size, last,
                           last.snapshot if self.recurrent and walk else None)

    def num_cached_blocks(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """Leading full blocks of ``token_ids`` the tree holds a path for under
        ``cache_salt``, usable or not (nothing changes)."""
        path = self._walk(token_ids, self.root_of(cache_salt))
        return path[-1][0].start + path[-1][1] if path else 0

    def node_for(self, token_ids: Sequence[int], cache_salt: str | None = None) -> RadixNode:
        """The node ending after the cached full blocks of ``token_ids`` under ``cache_salt``
        (split there when inside a node; refreshed; the salt's root, made if new, when none
        is cached): what a request that holds them locks."""
        root = self.root_of(cache_salt, create=True)
        path = self._walk(token_ids, root)
        return self._cut(path, path[-1][0].start + path[-1][1] if path else 0, root)

    def insert(self, token_ids: Sequence[int], block_ids: list[list[int]] | None = None,
               start: int = 0, cache_salt: str | None = None) -> int:
        """Cache the full blocks of ``token_ids``, held per group in ``block_ids``.

        The tree takes one pool reference of each newly inserted block. Where it already
        held blocks from block ``start`` on, it takes the caller's in place of its own when
        no request holds those (so the caller, which computed them again, shares the tree's
        path and an evicted copy is not kept twice) and fills its tombstones with them; else
        the caller keeps its own duplicates.

        Args:
            token_ids: Tokens whose K/V are in ``block_ids``; a trailing partial block is
                ignored.
            block_ids: Per group, one block id per block of ``token_ids`` (extra ones are
                ignored; ``NULL_BLOCK`` in a sliding group: a block the caller no longer
                holds). None only for a simulated tree, which then numbers new blocks.
            start: Blocks before this are known to be the tree's own (the caller's hit, or
                what it inserted before).
            cache_salt: The namespace the blocks go in (None: the unsalted one).

        Returns:
            Tokens (a multiple of ``block_size``) the tree already held before this call.

        Raises:
            ValueError: Too few ``block_ids``, or none given to a tree over a pool.
        """
        num_blocks = len(token_ids) // self.block_size
        if block_ids is None and self.pool is not None:
            raise ValueError("block_ids are required when the tree holds pool references")
        if block_ids is not None and (len(block_ids) != self.num_groups or any(
                len(v) < num_blocks for v in block_ids)):
            raise ValueError(f"{len(token_ids)} tokens need {num_blocks} blocks in each of "
                             f"{self.num_groups} groups, got {[len(v) for v in block_ids]}")
        root = self.root_of(cache_salt, create=num_blocks > 0)
        if root is None:
            return 0
        path = self._walk(token_ids, root)
        present = path[-1][0].start + path[-1][1] if path else 0
        if block_ids is None:  # a simulated tree numbers its new blocks
            block_ids = [[NULL_BLOCK] * present + [next(self._sim_block_ids) for _ in range(
                present, num_blocks)] for _ in self.windows]
        node = self._cut(path, present, root)
        if self.pool is not None and start < present:
            self._take_caller_blocks(node, block_ids, start)
        if present < num_blocks:
            value = [list(v[present:num_blocks]) for v in block_ids]
            key = tuple(token_ids[present * self.block_size:num_blocks * self.block_size])
            new = self._node(cache_salt=cache_salt, key=key, value=value, start=present,
                             parent=node, last_access_time=next(self._clock))
            node.children[key[:self.block_size]] = new
            for g, v in enumerate(value):
                held = [b for b in v if b != NULL_BLOCK]
                assert len(held) == len(v) or self.windows[g] is not None, (g, v)
                if self.pool is not None:
                    self.pool.incref(held)
                if self.windows[g] is not None:
                    for i, b in enumerate(v):
                        if b != NULL_BLOCK:
                            self._where[b] = (new, g, present + i)
                self._count(new, g, len(held))
        return present * self.block_size

    def _take_caller_blocks(self, node: RadixNode, block_ids: list[list[int]],
                            start: int) -> None:
        """On the path to ``node``, from block ``start`` on: the caller's block replaces a
        tombstone, or a block only the tree holds (see :meth:`insert`)."""
        at = node
        while at.parent is not None and self._end(at) > start:
            for g, v in enumerate(at.value):
                ids = block_ids[g]
                for i in range(max(start - at.start, 0), len(v)):
                    new, old = ids[at.start + i], v[i]
                    if new == NULL_BLOCK or new == old or (
                            old != NULL_BLOCK and self.pool.ref_cnt(old) > 1):
                        continue
                    if old != NULL_BLOCK:
                        self._forget(at, g, [old])
                    v[i] = new
                    self.pool.incref([new])
                    if self.windows[g] is not None:
                        self._where[new] = (at, g, at.start + i)
                    self._count(at, g, 1)
            at = at.parent

    def attach_snapshot(self, token_ids: Sequence[int], blocks: list[int],
                        cache_salt: str | None = None) -> bool:
        """Give the node ending after ``token_ids`` (cached under ``cache_salt``; split there
        if needed) the recurrent snapshot in ``blocks``, taking the caller's pool reference
        of them.

        Returns:
            False (nothing taken) when the tokens are not all cached or the node has one.
        """
        root = self.root_of(cache_salt)
        path = self._walk(token_ids, root)
        n = len(token_ids) // self.block_size
        if not n or not path or path[-1][0].start + path[-1][1] != n:
            return False
        node = self._cut(path, n, root)
        if node.snapshot is not None:
            return False
        node.snapshot = list(blocks)
        for b in blocks:
            self._where[b] = (node, _SNAPSHOT, n)
        self._count(node, _SNAPSHOT, len(blocks))
        self.release(blocks)
        return True

    def _count(self, node: RadixNode, group: int, n: int) -> None:
        """``n`` more block ids of ``group`` held by ``node`` (none of them idle)."""
        node.held[group] += n
        self.held[group] += n
        if node.lock_ref == 0:
            self.evictable[group] += n

    # ------------------------------------------------------------------ idle blocks

    def _owner(self, block: int) -> tuple[RadixNode, int, int]:
        """The node holding droppable ``block`` (splits only add nodes above the recorded
        one), its group and its index in the node (a snapshot's: 0)."""
        node, group, pos = self._where[block]
        if group == _SNAPSHOT:
            return node, group, 0
        while node.start > pos:
            node = node.parent
        return node, group, pos - node.start

    def release(self, blocks: Iterable[int]) -> None:
        """Blocks a request dropped a reference of: droppable ones the tree alone holds now
        become idle (most recently used)."""
        if self.pool is None:
            return
        for b in blocks:
            if b in self._where and b not in self._idle and self.pool.ref_cnt(b) == 1:
                self._idle[b] = next(self._clock)
                node, g, _ = self._owner(b)
                node.idle[g] += 1
                if node.lock_ref:
                    self.evictable[g] += 1

    def acquire(self, blocks: Iterable[int]) -> None:
        """Blocks a request took a reference of: no longer idle."""
        for b in blocks:
            if self._idle.pop(b, None) is not None:
                node, g, _ = self._owner(b)
                node.idle[g] -= 1
                if node.lock_ref:
                    self.evictable[g] -= 1

    # ------------------------------------------------------------------ locks and eviction

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its ancestors from trimming (SGLang ``inc_lock_ref``)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                for g, (h, i) in enumerate(zip(node.held, node.idle)):
                    self.evictable[g] -= h - i
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one :meth:`lock` of ``node`` (SGLang ``dec_lock_ref``)."""
        while node.parent is not None:
            assert node.lock_ref > 0, node
            node.lock_ref -= 1
            if node.lock_ref == 0:
                for g, (h, i) in enumerate(zip(node.held, node.idle)):
                    self.evictable[g] += h - i
            node = node.parent

    def evict(self, num_blocks: int) -> int:
        """Drop at least ``num_blocks`` blocks the tree alone holds (fewer when it has no
        more): of an idle droppable block and the least recently used unlocked leaf, the
        older first, whatever their namespaces. A leaf loses its snapshot and blocks tail
        first; an emptied leaf is removed and its parent becomes a candidate (an emptied
        salted root goes).

        Returns:
            Blocks dropped (their pool references released).
        """
        # NOTE: leaves are collected per call (O(nodes)), as SGLang's ``_collect_leaves`` does.
        heap = [(n.last_access_time, n.node_id, n) for n in self._nodes()
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_blocks and (heap or self._idle):
            while heap and (heap[0][2].children or heap[0][2].lock_ref or heap[0][2].removed):
                heapq.heappop(heap)  # stale: a child was added, locked, or removed
            oldest = next(iter(self._idle.items()), None)
            if oldest is not None and (not heap or oldest[1] < heap[0][0]):
                evicted += self._drop(oldest[0])
                continue
            if not heap:
                break
            _, _, leaf = heapq.heappop(heap)
            evicted += self._trim(leaf, num_blocks - evicted)
            if not leaf.removed:
                heapq.heappush(heap, (leaf.last_access_time, leaf.node_id, leaf))
                continue
            parent = leaf.parent
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.node_id, parent))
        return evicted

    def _drop(self, block: int) -> int:
        """Drop idle droppable ``block`` (a tombstone, or the node's whole snapshot)."""
        node, group, index = self._owner(block)
        if group == _SNAPSHOT:
            return self._drop_snapshot(node)
        assert node.value[group][index] == block, (block, node)
        if self.on_evict is not None:
            self.on_evict(node, index)
        node.value[group][index] = NULL_BLOCK
        self._forget(node, group, [block])
        return 1

    def _drop_snapshot(self, node: RadixNode) -> int:
        if self.on_evict is not None and node.snapshot:
            self.on_evict(node, self._size(node) - 1)
        blocks, node.snapshot = node.snapshot or [], None
        self._forget(node, _SNAPSHOT, blocks)
        return len(blocks)

    def _forget(self, node: RadixNode, group: int, blocks: list[int]) -> None:
        """Release the tree's reference of ``blocks`` of ``group`` held by ``node``."""
        for b in blocks:
            self._where.pop(b, None)
            idle = self._idle.pop(b, None) is not None
            node.idle[group] -= idle
            if idle or node.lock_ref == 0:
                self.evictable[group] -= 1
            node.held[group] -= 1
            self.held[group] -= 1
        if self.pool is not None:
            self.pool.free(reversed(blocks))

    def _trim(self, leaf: RadixNode, want: int) -> int:
        """Drop ``leaf``'s snapshot, then its blocks tail first until ``want`` are dropped
        (a position's blocks go together); remove it when emptied. Returns blocks dropped."""
        dropped = self._drop_snapshot(leaf) if leaf.snapshot else 0
        n = self._size(leaf)
        while self.windows and n and dropped < want:
            n -= 1
            if self.on_evict is not None:
                self.on_evict(leaf, n)
            for g, v in enumerate(leaf.value):
                if v[n] != NULL_BLOCK:
                    self._forget(leaf, g, [v[n]])
                    dropped += 1
                del v[n]
        if n == 0 or not self.windows:
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[:self.block_size]]
            leaf.removed = True
            if parent.parent is None and not parent.children and parent is not self.root:
                del self._roots[parent.cache_salt]  # an empty salted namespace
        else:
            leaf.key = leaf.key[:n * self.block_size]
        return dropped

    # ------------------------------------------------------------------ compaction

    def remap(self, moves: dict[int, int]) -> None:
        """Rename the blocks the tree holds, ``src -> dst`` (the pool moved their references:
        :meth:`BlockPool.relocate`, before the pool shrinks); their LRU order is kept."""
        if not moves:
            return
        for node in self._nodes():
            node.value = [[moves.get(b, b) for b in v] for v in node.value]
            if node.snapshot:
                node.snapshot = [moves.get(b, b) for b in node.snapshot]
        self._where = {moves.get(b, b): w for b, w in self._where.items()}
        self._idle = {moves.get(b, b): t for b, t in self._idle.items()}

    # ------------------------------------------------------------------ inspection

    def _nodes(self) -> list[RadixNode]:
        """Every node but the roots, every namespace's, parents before children."""
        out, stack = [], [c for r in self.roots() for c in r.children.values()]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        """Assert the tree is consistent.

        Raises:
            AssertionError: A key/value size mismatch, a mis-indexed child, a wrong start, a
                negative lock count, a lock count below its children's sum, held/idle/
                evictable counts that disagree with the nodes, a full-attention tombstone, a
                block in two places (within a namespace or across two), a node outside its
                root's namespace, or a block without a pool reference.
        """
        bs, seen = self.block_size, set()
        evictable, total = [0] * len(self.held), [0] * len(self.held)
        for node in [*self.roots(), *self._nodes()]:
            assert node.lock_ref >= 0, node
            for k, child in node.children.items():
                assert child.parent is node and k == child.key[:bs], (k, child)
                assert child.start == self._end(node), (child.start, self._end(node))
                assert child.cache_salt == node.cache_salt, (child, node)
            if node.parent is None:
                assert not node.key and node.lock_ref == 0 and not any(node.held), node
                assert self.root_of(node.cache_salt) is node, node
                continue
            assert node.key and len(node.key) % bs == 0 and all(
                len(node.key) == len(v) * bs for v in node.value), node
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), node
            for g, v in enumerate(node.value):
                assert self.windows[g] is not None or NULL_BLOCK not in v, (g, node)
            per_group = [[b for b in v if b != NULL_BLOCK] for v in node.value]
            per_group.append(list(node.snapshot or ()))
            for g, blocks in enumerate(per_group):
                idle = sum(b in self._idle for b in blocks)
                assert (node.held[g], node.idle[g]) == (len(blocks), idle), (g, node)
                evictable[g] += idle if node.lock_ref else len(blocks)
                total[g] += len(blocks)
            for b in _held(node):
                assert b not in seen, f"block {b} in two places"
                seen.add(b)
                assert self.pool is None or self.pool.ref_cnt(b) >= 1, (b, node)
                assert b not in self._idle or self.pool.ref_cnt(b) == 1, (b, node)
        droppable = {b for node in self._nodes() for g in self._sliding
                     for b in node.value[g] if b != NULL_BLOCK}
        droppable |= {b for node in self._nodes() for b in node.snapshot or ()}
        assert set(self._where) == droppable, "droppable index out of date"
        assert set(self._idle) <= droppable
        assert (evictable, total) == (self.evictable, self.held), \
            ((evictable, total), (self.evictable, self.held))

    def blocks(self) -> list[int]:
        """Every block id in the tree (the tree's holder list for pool invariants)."""
        return [b for node in self._nodes() for b in _held(node)]

    def pretty_print(self) -> str:
        """The tree as indented lines: first block of each key, blocks, lock_ref, access time;
        each salted namespace under its own root line (the salt, a secret, as a digest)."""
        lines = [f"root evictable={self.evictable_blocks} protected={self.protected_blocks}"]
        for root in self.roots():
            if root.cache_salt is not None:
                digest = hashlib.sha256(root.cache_salt.encode("utf-8", "surrogatepass"))
                lines.append(f"root cache_salt=sha256:{digest.hexdigest()[:12]}")
            lines.extend(self._subtree_lines(root))
        return "\n".join(lines)

    def _subtree_lines(self, root: RadixNode) -> list[str]:
        lines, stack = [], [(c, 1) for c in reversed(root.children.values())]
        while stack:
            node, depth = stack.pop()
            more = f"+{len(node.key) - self.block_size}" if len(node.key) > self.block_size else ""
            value = node.value[0] if len(node.value) == 1 else node.value
            snap = f" snapshot={node.snapshot}" if node.snapshot else ""
            lines.append(f"{'  ' * depth}{list(node.key[:self.block_size])}{more} "
                         f"blocks={value} lock={node.lock_ref} t={node.last_access_time}{snap}")
            stack.extend((c, depth + 1) for c in reversed(node.children.values()))
        return lines


def _held(node: RadixNode) -> list[int]:
    """The block ids ``node`` holds: its blocks, group by group, then its snapshot."""
    return [b for v in node.value for b in v if b != NULL_BLOCK] + list(node.snapshot or ())
