"""KV cache groups: which layers share a block table, and what one request holds in each.

Pure Python (no mlx). Follows vLLM's hybrid KV cache manager (``KVCacheGroupSpec``, uniform
page size): layers of one kind (full attention, or a sliding window of one size) form groups
of ``num_slots`` layers each, and every group has its own block table per request. A block
id is a column of ``num_slots`` layer slots in the pool (slot ``j`` of a block stores the
``j``-th layer of whichever group owns the block), so one pool of blocks serves every group
and memory moves between full and sliding-window layers as requests need it. Gemma 3 270M's
18 layers (3 full, 15 with a 512-token window) become 6 groups of 3: one full group, whose
table grows with the request, and five window groups whose tables keep only the last window.

A sliding-window group frees every block that falls entirely before ``position - window``
(no future query reads it), so a request holds at most ``ceil((window - 1 + chunk) /
block_size) + 1`` blocks there, ``chunk`` the tokens one step computes: prefill chunks are
capped at :attr:`KVCacheLayout.max_chunk_tokens` (half the smallest window, at least 256
tokens) so that this stays near the window (Gemma 3 270M: 512-token windows, 256-token chunks,
49 blocks of 16 a request while it prefills, 33 while it decodes; mlx-lm's rotating caches
keep 512 tokens after a prefill). Sizing and admission count that cap; a chunk goes past it
only into blocks that are free and that no request needs to finish
(:meth:`KVCacheLayout.chunk_for_spare`), holding ``window + chunk`` tokens for a step as vLLM's
sliding-window manager, which never caps a chunk, does. Layers whose pool shapes differ
between kinds (Gemma 4's global layers) cannot share slots: they keep one group and page every
layer for every token (vLLM does the same), and :attr:`KVCacheLayout.note` says why.

Recurrent-state layers (mlx-lm's ``ArraysCache``) have no table: a request's live state is
the worker's, and a snapshot of it (every recurrent entry, at one position) is stored in
:attr:`KVCacheLayout.snapshot_blocks` blocks of the same pool, so it is counted in the KV
budget and evicted with the radix tree's blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from mlxpa.utils import cdiv

# The smallest prefill chunk of a model with sliding windows (tokens).
MIN_CHUNK_TOKENS = 256


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One KV cache group (vLLM's ``KVCacheGroupSpec``).

    Attributes:
        sliding_window: The window of its layers in tokens; None for full attention.
        entries: The mlx-lm cache entries it pages, ``entries[j]`` stored in layer slot ``j``.
    """

    sliding_window: int | None
    entries: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """How a model's KV cache is paged: its groups, the slots of a block, recurrent snapshots.

    Attributes:
        block_size: Tokens per block.
        groups: The attention groups, full-attention groups first; each request has one
            block table per group (empty: a model without K/V).
        num_slots: Layer slots per block (every group's layers fit, some slots of a smaller
            group stay unused).
        recurrent: Cache entries holding a recurrent state (no table).
        snapshot_blocks: Blocks one snapshot of every recurrent entry takes (0: no recurrent
            entry).
        note: Why sliding-window layers are paged as full attention, or None.
    """

    block_size: int
    groups: tuple[KVCacheGroupSpec, ...]
    num_slots: int
    recurrent: tuple[int, ...] = ()
    snapshot_blocks: int = 0
    note: str | None = None

    @property
    def windows(self) -> list[int | None]:
        """The sliding window of each group (None: full attention)."""
        return [g.sliding_window for g in self.groups]

    def group_kinds(self) -> list[str]:
        """A name per group's kind (``full_attention``, ``sliding_window_512``), then
        ``recurrent`` (the snapshots): the keys of the per-group KV figures."""
        return [f"sliding_window_{w}" if w is not None else "full_attention"
                for w in self.windows] + ["recurrent"]

    @property
    def max_chunk_tokens(self) -> int | None:
        """The most tokens of one request a step computes (prefill chunks), or None (no
        limit): half the smallest window, at least :data:`MIN_CHUNK_TOKENS`, in whole
        blocks, when a group has one."""
        windows = [w for w in self.windows if w is not None]
        if not windows:
            return None
        return cdiv(max(min(windows) // 2, MIN_CHUNK_TOKENS), self.block_size) * self.block_size

    def chunk_for_spare(self, spare_blocks: int) -> int | None:
        """The largest prefill chunk whose sliding-window blocks exceed those of a
        :attr:`max_chunk_tokens` chunk by at most ``spare_blocks`` over every window group
        (each block of tokens past the cap holds one more block in each); None without a
        window group."""
        cap = self.max_chunk_tokens
        if cap is None:
            return None
        window_groups = sum(w is not None for w in self.windows)
        return cap + max(spare_blocks, 0) // window_groups * self.block_size

    def window_blocks(self, window: int, chunk: int) -> int:
        """Most blocks a request holds at once in a group of ``window`` tokens while a step
        computes ``chunk`` of its tokens: those of the window before the chunk, the chunk's,
        one more where they straddle a block boundary."""
        return cdiv(window - 1 + chunk, self.block_size) + 1

    def blocks_needed(self, num_tokens: int, chunk: int) -> int:
        """Most blocks one request of ``num_tokens`` tokens holds at once over every group,
        computing at most ``chunk`` tokens a step (snapshots not included)."""
        n = cdiv(num_tokens, self.block_size)
        chunk = min(chunk, self.max_chunk_tokens or chunk)
        return sum(n if w is None else min(n, self.window_blocks(w, chunk))
                   for w in self.windows)


def group_entries(kinds: Sequence[tuple[int | None, Hashable] | None], block_size: int,
                  recurrent: Sequence[int] = (), snapshot_blocks: int = 0) -> KVCacheLayout:
    """Group a model's cache entries into KV cache groups (vLLM's uniform-page grouping).

    Args:
        kinds: Per cache entry, ``(window, pool_key)``: its sliding window (None: full
            attention) and what its pool looks like (entries of equal keys can share a
            slot); None for an entry without K/V (recurrent state, never written).
        block_size: Tokens per block.
        recurrent: The recurrent-state entries.
        snapshot_blocks: Blocks one snapshot of them takes.

    Returns:
        The layout. With one kind, one group of every K/V entry (a slot each). With several
        kinds of equal pool keys: each kind's entries in groups of ``size`` (the fewest
        entries of a kind; the most, when that is under 1.5 times the fewest, as vLLM);
        else one group paging every entry for every token, with a note.
    """
    buckets: dict[int | None, list[int]] = {}
    for i, kind in enumerate(kinds):
        if kind is not None:
            buckets.setdefault(kind[0], []).append(i)
    entries = [i for i, k in enumerate(kinds) if k is not None]
    common = dict(recurrent=tuple(recurrent), snapshot_blocks=snapshot_blocks)
    if len(buckets) <= 1:
        window = next(iter(buckets), None)
        groups = (KVCacheGroupSpec(window, tuple(entries)),) if entries else ()
        return KVCacheLayout(block_size, groups, len(entries), **common)
    keys = {kinds[i][1] for i in entries}
    if len(keys) > 1:
        note = ("sliding-window layers are paged as full attention: their K/V pools have "
                "other shapes than the full-attention layers', so one block cannot hold "
                "either kind (vLLM does the same)")
        return KVCacheLayout(block_size, (KVCacheGroupSpec(None, tuple(entries)),),
                             len(entries), note=note, **common)
    sizes = [len(v) for v in buckets.values()]
    size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    order = sorted(buckets, key=lambda w: (w is not None, w or 0))  # full attention first
    groups = tuple(KVCacheGroupSpec(w, tuple(buckets[w][k:k + size]))
                   for w in order for k in range(0, len(buckets[w]), size))
    return KVCacheLayout(block_size, groups, size, **common)


__all__ = ["KVCacheGroupSpec", "KVCacheLayout", "MIN_CHUNK_TOKENS", "group_entries"]
