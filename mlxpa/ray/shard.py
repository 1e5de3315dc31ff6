"""Shards for the Ray replicas: contiguous runs of rows that keep prefix groups whole.

Pure Python (no mlx, no ray). A replica only gains from its prefix cache when the rows that
share a prefix reach it together, so :func:`plan_shards` orders the rows depth-first over
their block-level radix tree (:func:`mlxpa.core.prefix_order.prefix_order`, the order a local
run admits rows in) and packs whole prefix groups (runs of rows that each share a block with
the next) into shards of at most ``shard_rows`` rows; a single group may fill a shard up to
twice that, and a longer group is cut where its own subtree branches highest. Rows with
different ``cache_salt`` share nothing (each salt is its own tree). Ray Data hands each shard
to one replica (one actor task).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mlxpa.core.prefix_order import prefix_order

SHARDINGS = ("prefix", "input", "random")


def plan_shards(token_lists: Sequence[Sequence[int]], block_size: int, shard_rows: int,
                sharding: str = "prefix", seed: int = 0,
                salts: Sequence[str | None] | None = None) -> list[list[int]]:
    """Split rows into shards, one Ray task each.

    Args:
        token_lists: Prompt token ids of each row (positions 0..len-1).
        block_size: Tokens per KV block (prefixes are shared in whole blocks).
        shard_rows: Target rows per shard (>= 1); a prefix shard holds at most this many,
            unless one prefix group alone is longer (up to twice this; longer groups are
            cut in pieces of half to one and a half times this).
        sharding: ``prefix`` (radix order, cuts between prefix groups), ``input`` (file order,
            equal cuts) or ``random`` (a seeded shuffle, equal cuts: the baseline that shows
            what keeping groups together is worth).
        seed: Shuffle seed for ``random``.
        salts: Each row's ``cache_salt`` (None: all unsalted); rows of two salts never
            count as sharing a prefix.

    Returns:
        Lists of positions into ``token_lists``; every position appears exactly once.

    Raises:
        ValueError: An unknown ``sharding``, ``shard_rows`` or ``block_size`` below 1, or not
            one salt per row.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    if sharding == "prefix":
        order = prefix_order([list(t) for t in token_lists], block_size, salts)
        shared = [shared_blocks(token_lists[a], token_lists[b], block_size)
                  if salts is None or salts[a] == salts[b] else 0
                  for a, b in zip(order, order[1:])]
        return [order[a:b] for a, b in _prefix_cuts(shared, len(order), shard_rows)]
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    order = list(range(len(token_lists)))
    if sharding == "random":
        random.Random(seed).shuffle(order)
    return [order[i:i + shard_rows] for i in range(0, len(order), shard_rows)]


def shared_blocks(a: Sequence[int], b: Sequence[int], block_size: int) -> int:
    """Whole blocks at the start of ``a`` and ``b`` that hold the same tokens."""
    n = 0
    limit = min(len(a), len(b)) // block_size
    while n < limit and a[n * block_size:(n + 1) * block_size] == \
            b[n * block_size:(n + 1) * block_size]:
        n += 1
    return n


def _prefix_cuts(shared: list[int], num_rows: int, target: int) -> list[tuple[int, int]]:
    """``(start, end)`` ranges over ``num_rows`` ordered rows, where ``shared[i]`` is the
    blocks rows ``i`` and ``i + 1`` share. A prefix group (a run of rows each sharing a block
    with the next) is never cut unless it is longer than ``2 * target``; groups are packed
    into a shard while it stays within ``target`` rows (a single group may exceed it)."""
    bounds = [0, *(c for c in range(1, num_rows) if shared[c - 1] == 0), num_rows]
    ranges, start = [], 0
    for a, b in zip(bounds, bounds[1:]):
        if b - a > 2 * target:  # too long for one shard: cut inside, where it branches
            if start < a:
                ranges.append((start, a))
            ranges.extend(_split(shared, a, b, target))
            start = b
        elif b - start > target and start < a:
            ranges.append((start, a))
            start = a
    if start < num_rows:
        ranges.append((start, num_rows))
    return ranges


def _split(shared: list[int], start: int, end: int, target: int) -> list[tuple[int, int]]:
    """One long prefix group ``[start, end)`` cut into ranges of about ``target`` rows, each
    cut in ``[start + target / 2, start + 3 target / 2]`` at the smallest share (its subtree
    branches highest there), nearest ``start + target`` on ties."""
    ranges = []
    while end - start > target + target // 2:
        lo, hi = start + max(1, target // 2), start + target + target // 2
        cut = min(range(lo, hi + 1), key=lambda c: (shared[c - 1], abs(c - start - target)))
        ranges.append((start, cut))
        start = cut
    ranges.append((start, end))
    return ranges
