"""The disk tier under the radix tree: which blocks go to disk, and prefix hits that continue
on disk.

Pure Python (no mlx); the KV cache manager's part of the tier (SGLang HiCache's storage
layer under its radix tree; vLLM's KV offloading). The files are :mod:`mlxpa.core.disk_cache`'s.

**Written**: a block position that a prefix hit covered (some request read it from the tree:
it was worth keeping, a unique prompt's blocks are not) when it leaves memory (the tree
evicts it, or drops one of its sliding-window blocks), and, at the end of a run or a server's
life, every such position still in memory (:meth:`DiskTier.write_back`). A position's file
holds its full-attention blocks and, of each sliding-window group, the block if the tree
still has it and it lies in the window before the end of its node (where hits end: a hit of
``L`` tokens needs the window before ``L`` only). The scheduler queues ``(header, blocks)``
saves in ``SchedulerOutput.kv_saves``; the runner reads their bytes before the step's
forward (so a block the step reuses is read first) and the store writes them on a thread.

**Read back**: after the tree's match (``m`` blocks), the chain continues over the next full
blocks; each file found is read and verified (:meth:`DiskStore.read`), the hit ends at the
deepest usable position (every full-attention block; each sliding group's window before the
end, from the files or the tree; the same rule as the tree's tombstones), fresh blocks are
allocated (evicting the tree's LRU blocks if needed; never a running request's), the bytes
go to the runner in ``SchedulerOutput.kv_loads`` (written before the forward), and the blocks
join the tree, so the request's hit includes them. Reading is chosen while it is faster than
computing: the tier keeps the measured milliseconds of reading a block and the engine those
of computing one (:attr:`DiskTier.recompute_ms_per_block`), and reads while the first is at
most the second (or either is unknown).

A model with recurrent layers has no disk tier (its hits need snapshots, which the files do
not hold): :func:`supports_disk_tier`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool
from mlxpa.core.disk_cache import BlockHeader, DiskStore, chain_keys, chain_root
from mlxpa.core.kv_cache_groups import KVCacheLayout
from mlxpa.core.radix_cache import PrefixMatch, RadixCache, RadixNode
from mlxpa.request import Request

# Bounds of the side tables (entries): the keys of hit blocks, of blocks known on disk, and
# the memo of nodes' keys.
_MAX_HIT_KEYS = 1 << 20
_MAX_KNOWN = 1 << 18
_MAX_MEMO = 1 << 16


class KVSave(NamedTuple):
    """A block position to write: its file's header and the pool blocks of its present
    groups, in group order (the runner reads them, the store writes the file)."""

    header: BlockHeader
    blocks: list[int]


class KVLoad(NamedTuple):
    """Bytes read from disk for pool ``blocks`` (``len(blocks) * block_nbytes``, in order),
    written by the runner before the step's forward."""

    blocks: list[int]
    payload: bytes


def supports_disk_tier(layout: KVCacheLayout) -> bool:
    """Whether the disk tier serves this layout: K/V groups and no recurrent state."""
    return bool(layout.groups) and not layout.recurrent


class DiskTier:
    """The disk tier of one KV cache manager.

    Args:
        store: The files.
        tree: The radix tree (its evictions call :meth:`on_evict`).
        pool: The block pool.
        layout: The KV cache groups (:func:`supports_disk_tier` must hold).

    Attributes:
        disk_hit_tokens: Prompt tokens of admitted requests' hits read from disk, since
            :meth:`take_hit_tokens`.
        read_ms_per_block: Measured milliseconds to read and verify one position (EWMA).
        recompute_ms_per_block: Milliseconds to compute one block's tokens, from the
            engine's steps (EWMA), or None.
    """

    def __init__(self, store: DiskStore, tree: RadixCache, pool: BlockPool,
                 layout: KVCacheLayout) -> None:
        assert supports_disk_tier(layout), layout
        self.store, self.tree, self.pool = store, tree, pool
        self.bs = pool.block_size
        self.windows = layout.windows
        self.full = [g for g, w in enumerate(self.windows) if w is None]
        self.sliding = [g for g, w in enumerate(self.windows) if w is not None]
        self._roots: dict[str | None, bytes] = {}
        self._chains: dict[int, list[bytes]] = {}  # by request key: keys of its blocks
        self._memo: dict[tuple[int, int], list[bytes]] = {}  # (node_id, start) -> keys
        self._hit: dict[bytes, None] = {}  # keys of blocks a hit covered (ordered set)
        self._known: dict[bytes, tuple[bool, ...]] = {}  # on disk: its groups
        self._saves: list[KVSave] = []
        self._loads: list[KVLoad] = []
        self._loading: set[int] = set()  # blocks whose load is queued, not yet run
        self._pending: dict[int, int] = {}  # request key -> tokens loaded for its hit
        self.disk_hit_tokens = 0
        self.read_ms_per_block: float | None = None
        self.recompute_ms_per_block: float | None = None
        tree.on_evict = self.on_evict

    # ------------------------------------------------------------------ keys

    def _root(self, salt: str | None) -> bytes:
        root = self._roots.get(salt)
        if root is None:
            root = self._roots[salt] = chain_root(self.store.namespace, salt)
        return root

    def _keys(self, req: Request, tokens: Sequence[int]) -> list[bytes]:
        """Keys of ``tokens``' full blocks (a prefix of ``req``'s tokens), memoized."""
        keys = self._chains.setdefault(req.key, [])
        n = len(tokens) // self.bs
        if len(keys) < n:
            root = self._root(req.cache_salt)
            keys += chain_keys(root, tokens[:n * self.bs], self.bs, len(keys),
                               keys[-1] if keys else root)
        return keys

    def _node_keys(self, node: RadixNode) -> list[bytes]:
        """Keys of ``node``'s blocks (memoized per node and start; a split moves the start)."""
        up: list[RadixNode] = []
        at = node
        while at.parent is not None and (at.node_id, at.start) not in self._memo:
            up.append(at)
            at = at.parent
        if len(self._memo) > _MAX_MEMO:
            self._memo.clear()
            return self._keys_from_root(node)
        if at.parent is None:  # the root: its salt (a salt-namespaced root carries one)
            parent = self._root(getattr(at, "cache_salt", None))
        else:
            parent = self._memo[(at.node_id, at.start)][self.tree._size(at) - 1]
        for n in reversed(up):
            keys = chain_keys(b"", n.key, self.bs, 0, parent)
            self._memo[(n.node_id, n.start)] = keys
            parent = keys[-1]
        return self._memo[(node.node_id, node.start)]

    def _keys_from_root(self, node: RadixNode) -> list[bytes]:
        path = []
        at = node
        while at.parent is not None:
            path.append(at)
            at = at.parent
        parent = self._root(getattr(at, "cache_salt", None))
        keys: list[bytes] = []
        for n in reversed(path):
            keys = chain_keys(b"", n.key, self.bs, 0, parent)
            parent = keys[-1]
        return keys

    def _first(self, g: int, end: int) -> int:
        """The first block a hit ending after block ``end - 1`` needs in sliding group
        ``g``."""
        return max(0, end * self.bs - self.windows[g] + 1) // self.bs

    # ------------------------------------------------------------------ writing

    def on_evict(self, node: RadixNode, index: int) -> None:
        """The tree is about to drop blocks of ``node`` at ``index`` (some group's, or the
        whole position): queue a save of the position if a hit covered it and the disk
        lacks what the tree holds there."""
        keys = self._node_keys(node)
        key = keys[index]
        if key not in self._hit:
            return
        pos, end = node.start + index, self.tree._end(node)
        present = [node.value[g][index] != NULL_BLOCK for g in range(len(self.windows))]
        for g in self.sliding:
            present[g] = present[g] and pos >= self._first(g, end)
        if not all(present[g] for g in self.full):
            return
        blocks = [node.value[g][index] for g, p in enumerate(present) if p]
        if self._loading.intersection(blocks):
            return  # its bytes arrive with this step's loads: on disk already
        known = self._on_disk(key)
        if known is not None and all(k or not p for k, p in zip(known, present)):
            return
        parent = keys[index - 1] if index else self._parent_key(node)
        tokens = tuple(node.key[index * self.bs:(index + 1) * self.bs])
        self._saves.append(KVSave(BlockHeader(key, parent, pos, tokens, tuple(present)),
                                  blocks))
        self._remember(key, tuple(present))

    def _parent_key(self, node: RadixNode) -> bytes:
        parent = node.parent
        if parent.parent is None:
            return self._root(getattr(parent, "cache_salt", None))
        return self._node_keys(parent)[self.tree._size(parent) - 1]

    def _on_disk(self, key: bytes) -> tuple[bool, ...] | None:
        """The groups the disk holds for ``key`` as far as this process knows, or all
        groups when another process wrote it (not read here); None: no file."""
        known = self._known.get(key)
        if known is not None:
            return known
        if self.store.contains(key):
            return (True,) * len(self.windows)
        return None

    def _remember(self, key: bytes, groups: tuple[bool, ...]) -> None:
        if len(self._known) >= _MAX_KNOWN:
            self._known.pop(next(iter(self._known)))
        self._known[key] = groups

    def write_back(self) -> list[KVSave]:
        """Saves of every position in the tree a hit covered that the disk lacks (the end of
        a run, a server's shutdown, before the pool is rebuilt)."""
        if not self.store.writable:
            return []
        for node in self.tree._nodes():
            for i in range(self.tree._size(node)):
                self.on_evict(node, i)
        saves, self._saves = self._saves, []
        return saves

    # ------------------------------------------------------------------ reading

    def extend(self, req: Request, tokens: Sequence[int], match: PrefixMatch) -> PrefixMatch:
        """``match`` (the tree's hit of ``tokens``) continued with the blocks on disk, when
        reading them pays; their loads are queued and they join the tree.

        Args:
            req: The request looked up (its ``cache_salt`` roots the chain).
            tokens: Its tokens as matched (capped so the last prompt token is computed).
            match: The tree's hit.

        Returns:
            The tree's hit after the blocks read joined it (``match`` when none did).
        """
        bs, m = self.bs, match.num_tokens // self.bs
        n = len(tokens) // bs
        if m >= n or not self._reading_pays():
            return match
        held = [b for ids in match.block_ids for b in ids if b != NULL_BLOCK]
        room = self.pool.num_free_blocks + self.tree.evictable_blocks - len(held)
        keys = self._keys(req, tokens)
        root = self._root(req.cache_salt)
        found = []
        start = time.perf_counter()
        for p in range(m, n):
            if (p - m + 1) * len(self.full) > room:
                break
            got = self.store.read(keys[p], keys[p - 1] if p else root, p,
                                  tokens[p * bs:(p + 1) * bs])
            if got is None:
                break
            found.append(got)
            self._remember(keys[p], got[0].groups)
        if not found:
            return match
        ms = (time.perf_counter() - start) * 1e3 / len(found)
        self.read_ms_per_block = ms if self.read_ms_per_block is None else (
            0.8 * self.read_ms_per_block + 0.2 * ms)
        end, need = self._usable_end(m, found, room, len(tokens))
        if end == m:
            return match
        ids = self._allocate(match, need)
        if ids is None:
            return match
        flat, parts = [], []
        table = [list(match.block_ids[g][:m]) for g in range(len(self.windows))]
        for g, positions in enumerate(need):
            got = iter(ids[g])
            for p in range(m, end):
                if p in positions:
                    b = next(got)
                    table[g].append(b)
                    flat.append(b)
                    parts.append(found[p - m][1][g])
                else:
                    table[g].append(NULL_BLOCK)
        self._loads.append(KVLoad(flat, b"".join(parts)))
        self._loading.update(flat)
        self.tree.insert(tokens[:end * bs], table, m, cache_salt=req.cache_salt)
        self.pool.free(reversed(flat))  # the tree holds what it took
        self.tree.release(flat)
        hit = self.tree.match_prefix(tokens, req.cache_salt)
        self._pending[req.key] = max(0, min(end * bs, hit.num_tokens) - m * bs)
        return hit

    def _reading_pays(self) -> bool:
        read, compute = self.read_ms_per_block, self.recompute_ms_per_block
        return read is None or compute is None or read <= compute

    def _usable_end(self, m: int, found: list, room: int,
                    num_tokens: int) -> tuple[int, list[set[int]]]:
        """The deepest end (blocks) of a hit over the positions ``found`` after ``m``: every
        full group present up to it, each sliding group's window before it present (on disk
        after ``m``; the tree holds it before), its blocks and the request's next ones within
        ``room``; with the positions to load per group."""
        top = m
        while top - m < len(found) and all(found[top - m][0].groups[g] for g in self.full):
            top += 1
        for end in range(top, m, -1):
            need = [set(range(m, end)) if g in self.full else
                    set(range(max(m, self._first(g, end)), end)) for g in
                    range(len(self.windows))]
            if any(not found[p - m][0].groups[g] for g in self.sliding for p in need[g]):
                continue
            rest = len(self.windows) * (-(-(num_tokens + 1 - end * self.bs) // self.bs))
            if sum(map(len, need)) + rest <= room:
                return end, need
        return m, []

    def _allocate(self, match: PrefixMatch, need: list[set[int]]) -> list[list[int]] | None:
        """Blocks per group for ``need`` (evicting the tree's LRU blocks, ``match``'s kept),
        or None when the pool lacks them."""
        node = match.last_node
        held = [b for ids in match.block_ids for b in ids if b != NULL_BLOCK]
        if node is not None:
            self.tree.lock(node)
        self.pool.incref(held)
        self.tree.acquire(held)
        total = sum(map(len, need))
        if total > self.pool.num_free_blocks:
            self.tree.evict(total - self.pool.num_free_blocks)
        ids = None
        if total <= self.pool.num_free_blocks:
            ids = [self.pool.allocate(len(positions), g) for g, positions in enumerate(need)]
        self.pool.free(reversed(held))
        self.tree.release(held)
        if node is not None:
            self.tree.unlock(node)
        return ids

    # ------------------------------------------------------------------ requests

    def adopted(self, req: Request, hit: PrefixMatch) -> None:
        """``req`` was admitted with ``hit``: its blocks are worth keeping; count the tokens
        of it that came from disk."""
        tokens = req.all_token_ids[:hit.num_tokens]
        for key in self._keys(req, tokens)[:hit.num_tokens // self.bs]:
            self._hit[key] = None
        while len(self._hit) > _MAX_HIT_KEYS:
            self._hit.pop(next(iter(self._hit)))
        self.disk_hit_tokens += min(self._pending.pop(req.key, 0), hit.num_tokens)

    def forget(self, req: Request) -> None:
        """``req`` is finished or preempted."""
        self._chains.pop(req.key, None)
        self._pending.pop(req.key, None)

    def take(self) -> tuple[list[KVSave], list[KVLoad]]:
        """The saves and loads queued since the last call (the step being built)."""
        saves, loads = self._saves, self._loads
        self._saves, self._loads = [], []
        self._loading.clear()
        return saves, loads

    def take_hit_tokens(self) -> int:
        """:attr:`disk_hit_tokens` (and reset it)."""
        n, self.disk_hit_tokens = self.disk_hit_tokens, 0
        return n

    def observe_compute(self, seconds: float, num_tokens: int) -> None:
        """A step computed ``num_tokens`` prompt-heavy tokens in ``seconds``."""
        if num_tokens <= 0:
            return
        ms = seconds * 1e3 * self.bs / num_tokens
        old = self.recompute_ms_per_block
        self.recompute_ms_per_block = ms if old is None else 0.8 * old + 0.2 * ms


__all__ = ["DiskTier", "KVLoad", "KVSave", "supports_disk_tier"]
