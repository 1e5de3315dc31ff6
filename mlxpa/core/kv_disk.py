"""The disk tier under the radix tree: which blocks go to disk, and prefix hits that continue
on disk.

Pure Python (no mlx); the KV cache manager's part of the tier (SGLang HiCache's storage
layer under its radix tree; vLLM's KV offloading). The files are :mod:`mlxpa.core.disk_cache`'s.

**Written**: a block position that a prefix hit covered (some request read it from the tree:
it was worth keeping, a unique prompt's blocks are not) when it leaves memory (the tree
evicts it, drops one of its sliding-window blocks, or drops the recurrent snapshot at its
end), and, at the end of a run or a server's life, every such position still in memory
(:meth:`DiskTier.write_back`). A position's file holds its full-attention blocks, of each
sliding-window group the block if the tree still has it and it lies in the window before the
end of its node (where hits end: a hit of ``L`` tokens needs the window before ``L`` only),
and, for a model with recurrent layers, the snapshot the tree keeps after the position's last
token, if any (a recurrent hit ends only at a snapshot). The scheduler queues ``(header,
blocks)`` saves in ``SchedulerOutput.kv_saves``; the runner reads their bytes before the
step's forward (so a block the step reuses is read first) and the store writes them on a
thread. A file is written again only when the tree holds more of the position than it does
(a window block, a snapshot) and nothing less.

**Read back**: after the tree's match (``m`` blocks), the chain continues over the next full
blocks; each file found is read and verified (:meth:`DiskStore.read`), the hit ends at the
deepest usable position (every full-attention block; each sliding group's window before the
end, from the files or the tree; for a recurrent model, a snapshot there, from the file or
the tree: the tree's rules), fresh blocks are allocated (a snapshot's too; evicting the
tree's LRU blocks if needed; never a running request's), the bytes go to the runner in
``SchedulerOutput.kv_loads`` (written before the forward; a snapshot's then restored into
the request's recurrent state from its blocks, as a memory hit's is), and the blocks and the
snapshot join the tree, so the request's hit includes them. Reading is chosen while it is
faster than computing: the tier keeps the measured milliseconds of reading a block and the
engine those of computing one (:attr:`DiskTier.recompute_ms_per_block`), and reads while the
first is at most the second (or either is unknown).

A model without K/V (a state-space model alone: its positions have no blocks to chain) has
no disk tier: :func:`supports_disk_tier`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool
from mlxpa.core.disk_cache import BlockHeader, DiskStore, chain_keys, chain_root
from mlxpa.core.kv_cache_groups import KVCacheLayout
from mlxpa.core.pool_size import grow_for
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
    """Whether the disk tier serves this layout: it has K/V groups (recurrent snapshots or
    not)."""
    return bool(layout.groups)


def usable_ends(windows: Sequence[int | None], block_size: int, recurrent: bool, m: int,
                headers: Sequence[BlockHeader], tree_snapshots: set[int] = frozenset()
                ) -> Iterator[tuple[int, list[set[int]], bool]]:
    """The ends (blocks) a hit may have over the files ``headers`` of positions ``m ..``,
    deepest first: every full-attention group present up to it, each sliding group's window
    before it present (from ``m`` on; the tree holds it before), and, ``recurrent``, a
    snapshot there (in ``tree_snapshots``, or in the file of the block before it); with the
    positions to load per group and whether that file's snapshot is loaded."""
    full = [g for g, w in enumerate(windows) if w is None]
    sliding = [g for g, w in enumerate(windows) if w is not None]
    top = m
    while top - m < len(headers) and all(headers[top - m].groups[g] for g in full):
        top += 1
    for end in range(top, m, -1):
        snapshot = recurrent and end not in tree_snapshots
        if snapshot and not headers[end - 1 - m].snapshot:
            continue
        need = [set(range(m, end)) if w is None else
                set(range(max(m, max(0, end * block_size - w + 1) // block_size), end))
                for w in windows]
        if any(not headers[p - m].groups[g] for g in sliding for p in need[g]):
            continue
        yield end, need, snapshot


def position(keys: Sequence[bytes], root: bytes, tokens: Sequence[int], bs: int,
             p: int) -> tuple[bytes, bytes, int, Sequence[int]]:
    """What a file of block position ``p`` must name (its key, its parent's key, ``p``, the
    block's tokens): the arguments of :meth:`DiskStore.peek` and :meth:`DiskStore.read`."""
    return keys[p], keys[p - 1] if p else root, p, tokens[p * bs:(p + 1) * bs]


def peek_chain(store: DiskStore, keys: Sequence[bytes], root: bytes, tokens: Sequence[int],
               bs: int, start: int, stop: int) -> list[BlockHeader]:
    """The headers (peeked, not verified) of the consecutive files of positions ``start ..
    stop - 1``, up to the first position without one."""
    headers = []
    for p in range(start, stop):
        header = store.peek(*position(keys, root, tokens, bs, p))
        if header is None:
            break
        headers.append(header)
    return headers


def disk_prefix_end(store: DiskStore, layout: KVCacheLayout, tokens: Sequence[int],
                    cache_salt: str | None = None, start: int = 0) -> int:
    """The end (blocks) of the hit the disk tier would give ``tokens`` (capped as a lookup
    caps them) after ``start`` blocks from memory: the chain continued over the consecutive
    files that name their block (headers peeked, not verified) to the deepest usable end
    (:func:`usable_ends`; ``start`` when none). ``mlxpa plan``'s count; the pool's room and
    the tier's read-or-compute choice are not modelled."""
    bs = layout.block_size
    n = len(tokens) // bs
    root = chain_root(store.namespace, cache_salt)
    keys = chain_keys(root, tokens[:n * bs], bs)
    headers = peek_chain(store, keys, root, tokens, bs, start, n)
    for end, _, _ in usable_ends(layout.windows, bs, bool(layout.recurrent), start, headers):
        return end
    return start


class DiskTier:
    """The disk tier of one KV cache manager.

    Args:
        store: The files.
        tree: The radix tree (its evictions call :meth:`on_evict`).
        pool: The block pool.
        layout: The KV cache groups and recurrent snapshots (:func:`supports_disk_tier`
            must hold); ``store.snapshot_nbytes`` is a snapshot's state bytes, at most its
            ``snapshot_blocks`` blocks.

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
        self.recurrent = bool(layout.recurrent)
        self.snapshot_blocks = layout.snapshot_blocks
        self._roots: dict[str | None, bytes] = {}
        self._chains: dict[int, list[bytes]] = {}  # by request key: keys of its blocks
        self._memo: dict[tuple[int, int], list[bytes]] = {}  # (node_id, start) -> keys
        self._hit: dict[bytes, None] = {}  # keys of blocks a hit covered (ordered set)
        self._known: dict[bytes, tuple[bool, ...]] = {}  # on disk: its groups, snapshot
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
        """The tree is about to drop blocks of ``node`` at ``index`` (some group's, the whole
        position, or the snapshot at the node's end): queue a save of the position if a hit
        covered it and the disk lacks what the tree holds there."""
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
        snapshot = (self.recurrent and index == self.tree._size(node) - 1
                    and bool(node.snapshot))
        blocks = [node.value[g][index] for g, p in enumerate(present) if p]
        if snapshot:
            blocks += node.snapshot
        if self._loading.intersection(blocks):
            return  # its bytes arrive with this step's loads: on disk already
        parent = keys[index - 1] if index else self._parent_key(node)
        tokens = tuple(node.key[index * self.bs:(index + 1) * self.bs])
        have = (*present, snapshot)
        known = self._on_disk(key, parent, pos, tokens)
        if known is not None and (all(k or not h for k, h in zip(known, have))
                                  or not all(h or not k for k, h in zip(known, have))):
            return  # the file holds all of it, or something the tree no longer has
        self._saves.append(KVSave(BlockHeader(key, parent, pos, tokens, tuple(present),
                                              snapshot), blocks))
        self._remember(key, have)

    def _parent_key(self, node: RadixNode) -> bytes:
        parent = node.parent
        if parent.parent is None:
            return self._root(getattr(parent, "cache_salt", None))
        return self._node_keys(parent)[self.tree._size(parent) - 1]

    def _on_disk(self, key: bytes, parent: bytes, position: int,
                 tokens: Sequence[int]) -> tuple[bool, ...] | None:
        """The groups, then whether a snapshot, the disk holds for ``key``, as far as this
        process knows or the file's header says (another process wrote it); None: no
        file, or not one of this block."""
        known = self._known.get(key)
        if known is not None:
            return known
        header = self.store.peek(key, parent, position, tokens)
        return None if header is None else (*header.groups, header.snapshot)

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

        The positions after the hit that the tree holds in every group (a recurrent model's
        blocks whose snapshot was dropped, or never taken there) are used from the tree; the
        files are read from the first position it lacks.

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
        kept, snapshots = self._tree_path(tokens, req.cache_salt, m)
        skip = m + len(kept[0])  # the tree holds positions m .. skip - 1 in every group
        held = [b for ids in match.block_ids for b in ids if b != NULL_BLOCK]
        held += (match.snapshot or []) + [b for ids in kept for b in ids]
        pool = self.pool  # a pool below its ceiling grows for a hit (:meth:`_allocate`)
        room = (pool.num_free_blocks + pool.max_num_blocks - pool.num_blocks
                + self.tree.evictable_blocks - len(held))
        keys = self._keys(req, tokens)
        root = self._root(req.cache_salt)
        # peeked (header only): which ends are usable is known before reading; as many
        # positions as the room holds full-attention blocks for
        stop = n if not self.full else min(n, skip + room // len(self.full))
        headers = peek_chain(self.store, keys, root, tokens, bs, skip, stop)
        end, need, snapshot, found = self._read_end(keys, root, tokens, skip, headers, room,
                                                    snapshots)
        state = found[end - 1][1][len(self.windows)] if snapshot else None
        if end == skip and skip > m and self.recurrent:
            end, state = self._snapshot_within(req, tokens, m, skip, room, snapshots)
            need = [set() for _ in self.windows]
        if end == m or end == skip and state is None:
            return match
        node = (self.tree.node_for(tokens[:min(end, skip) * bs], req.cache_salt) if skip > m
                else match.last_node)
        ids = self._allocate(node, held, need, state is not None)
        if ids is None:
            return match
        flat, parts = [], []
        if end > skip:
            table = [list(match.block_ids[g][:m]) + kept[g] for g in range(len(self.windows))]
            for g, positions in enumerate(need):
                got = iter(ids[g])
                for p in range(skip, end):
                    if p in positions:
                        b = next(got)
                        table[g].append(b)
                        flat.append(b)
                        parts.append(found[p][1][g])
                    else:
                        table[g].append(NULL_BLOCK)
            self.tree.insert(tokens[:end * bs], table, skip, cache_salt=req.cache_salt)
            self.pool.free(reversed(flat))  # the tree holds what it took
            self.tree.release(flat)
        if state is not None:  # the tree takes the blocks' reference
            blocks = ids[len(self.windows)]
            if self.tree.attach_snapshot(tokens[:end * bs], blocks, req.cache_salt):
                flat += blocks
                parts += [state, bytes(len(blocks) * self.store.block_nbytes - len(state))]
            else:
                self.pool.free(blocks)
        self._loads.append(KVLoad(flat, b"".join(parts)))
        self._loading.update(flat)
        hit = self.tree.match_prefix(tokens, req.cache_salt)
        # the tokens whose blocks came from disk (a snapshot alone adds none)
        self._pending[req.key] = max(0, min(end * bs, hit.num_tokens) - skip * bs)
        return hit

    def _snapshot_within(self, req: Request, tokens: Sequence[int], m: int, skip: int,
                         room: int, tree_snapshots: set[int]) -> tuple[int, memoryview | None]:
        """A recurrent hit over positions the tree holds (``m .. skip - 1``) without the
        snapshot at their end: the deepest end with one in a file (its header peeked, then
        read and verified), and its state; ``(m, None)`` when there is none."""
        bs, keys, root = self.bs, self._keys(req, tokens), self._root(req.cache_salt)
        for end in range(skip, m, -1):
            rest = len(self.windows) * (-(-(len(tokens) + 1 - end * bs) // bs))
            if end in tree_snapshots or self.snapshot_blocks + rest > room:
                continue
            p = end - 1
            where = position(keys, root, tokens, bs, p)
            header = self.store.peek(*where)
            if header is None or not header.snapshot:
                continue
            got = self.store.read(*where)
            if got is not None and got[0].snapshot:
                self._remember(keys[p], (*got[0].groups, True))
                return end, got[1][len(self.windows)]
        return m, None

    def _reading_pays(self) -> bool:
        read, compute = self.read_ms_per_block, self.recompute_ms_per_block
        return read is None or compute is None or read <= compute

    def _tree_path(self, tokens: Sequence[int], salt: str | None,
                   m: int) -> tuple[list[list[int]], set[int]]:
        """Along ``tokens``' path in the tree: per group, the blocks of the positions from
        ``m`` on that it holds in every group (up to the first it lacks in one), and the ends
        (blocks) where it keeps a recurrent snapshot."""
        tree = self.tree
        kept: list[list[int]] = [[] for _ in self.windows]
        snapshots: set[int] = set()
        whole = True
        for c, k in tree._walk(tokens, tree.root_of(salt)):
            if self.recurrent and k == tree._size(c) and c.snapshot:
                snapshots.add(c.start + k)
            for i in range(max(0, m - c.start), k):
                whole = whole and all(v[i] != NULL_BLOCK for v in c.value)
                if whole:
                    for g, v in enumerate(c.value):
                        kept[g].append(v[i])
        return kept, snapshots

    def _read_end(self, keys: list[bytes], root: bytes, tokens: Sequence[int], m: int,
                  headers: list[BlockHeader], room: int, tree_snapshots: set[int]
                  ) -> tuple[int, list[set[int]], bool, dict[int, tuple]]:
        """The deepest end (blocks) of a hit over the files of ``headers`` (peeked, positions
        ``m ..``) that :meth:`_usable_end` allows and whose needed files read and verify:
        only those files are read (none when no end is usable); a file failing its checks
        (removed) ends the hit before it and the next end is tried (one whose header changed
        since it was peeked: its read header decides). With the positions to
        load per group, whether the snapshot is loaded, and the files read by position."""
        bs = self.bs
        found: dict[int, tuple] = {}
        spent, reads = 0.0, 0
        while True:
            end, need, snapshot = self._usable_end(m, headers, room, len(tokens), tree_snapshots)
            if end == m:
                break
            wanted = set().union(*need) | ({end - 1} if snapshot else set())
            bad = None
            for p in sorted(wanted - found.keys()):
                start = time.perf_counter()
                got = self.store.read(*position(keys, root, tokens, bs, p))
                spent += time.perf_counter() - start
                if got is None:
                    bad = p
                    break
                reads += 1
                found[p] = got
                self._remember(keys[p], (*got[0].groups, got[0].snapshot))
                if got[0] != headers[p - m]:  # rewritten since peeked: choose again
                    headers[p - m] = got[0]
                    bad = -1
                    break
            if bad is None:
                break
            if bad >= 0:
                del headers[bad - m:]  # the hit ends before a bad file (removed)
        if reads:
            ms = spent * 1e3 / reads
            self.read_ms_per_block = ms if self.read_ms_per_block is None else (
                0.8 * self.read_ms_per_block + 0.2 * ms)
        return end, need, snapshot, found

    def _usable_end(self, m: int, headers: list[BlockHeader], room: int, num_tokens: int,
                    tree_snapshots: set[int]) -> tuple[int, list[set[int]], bool]:
        """The deepest end (blocks) of a hit over the files of ``headers`` after ``m``
        (:func:`usable_ends`) whose blocks and the request's next ones fit ``room``; with the
        positions to load per group and whether the file's snapshot is loaded (``m`` and
        nothing: no such end)."""
        for end, need, snapshot in usable_ends(self.windows, self.bs, self.recurrent, m,
                                               headers, tree_snapshots):
            rest = len(self.windows) * (-(-(num_tokens + 1 - end * self.bs) // self.bs))
            if sum(map(len, need)) + rest + snapshot * self.snapshot_blocks <= room:
                return end, need, snapshot
        return m, [], False

    def _allocate(self, node: RadixNode | None, held: list[int], need: list[set[int]],
                  snapshot: bool) -> list[list[int]] | None:
        """Blocks per group for ``need``, then a snapshot's (none unless ``snapshot``),
        growing a pool below its ceiling first, then evicting the tree's LRU blocks but
        ``held`` (the hit's and the tree's positions it continues; ``node`` ends them: locked
        meanwhile), or None when the pool lacks them."""
        if node is not None:
            self.tree.lock(node)
        self.pool.incref(held)
        self.tree.acquire(held)
        sizes = [len(positions) for positions in need]
        sizes.append(self.snapshot_blocks if snapshot else 0)
        total = sum(sizes)
        short = total - self.pool.num_free_blocks
        short -= grow_for(self.pool, short)  # a pool below its ceiling grows before evicting
        if short > 0:
            self.tree.evict(short)
        ids = None
        if total <= self.pool.num_free_blocks:
            ids = [self.pool.allocate(n, g) for g, n in enumerate(sizes)]
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


__all__ = ["DiskTier", "KVLoad", "KVSave", "disk_prefix_end", "supports_disk_tier",
           "usable_ends"]
