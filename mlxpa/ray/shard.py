"""Shards for the Ray replicas: contiguous runs of rows that keep prefix groups whole.

Pure Python (no mlx, no ray). A replica only gains from its prefix cache when the rows that
share a prefix reach it together, so :func:`plan_shards` orders the rows depth-first over
their block-level radix tree (:func:`mlxpa.core.prefix_order.prefix_order`, the order a local
run admits rows in) and cuts that order into shards of about ``shard_rows`` rows, each cut
placed where neighbouring rows share the fewest whole blocks. A shard then holds whole prefix
groups unless a group is longer than 1.5 shards (then it is split where its own subtree
branches highest). Ray Data hands each shard to one replica (one actor task).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mlxpa.core.prefix_order import prefix_order

SHARDINGS = ("prefix", "input", "random")


def plan_shards(token_lists: Sequence[Sequence[int]], block_size: int, shard_rows: int,
                sharding: str = "prefix", seed: int = 0) -> list[list[int]]:
    """Split rows into shards, one Ray task each.

    Args:
        token_lists: Prompt token ids of each row (positions 0..len-1).
        block_size: Tokens per KV block (prefixes are shared in whole blocks).
        shard_rows: Target rows per shard (>= 1); prefix shards hold between half and one and
            a half times this, except the last.
        sharding: ``prefix`` (radix order, cuts between prefix groups), ``input`` (file order,
            equal cuts) or ``random`` (a seeded shuffle, equal cuts: the baseline that shows
            what keeping groups together is worth).
        seed: Shuffle seed for ``random``.

    Returns:
        Lists of positions into ``token_lists``; every position appears exactly once.

    Raises:
        ValueError: An unknown ``sharding``, or ``shard_rows`` or ``block_size`` below 1.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    if sharding == "prefix":
        order = prefix_order([list(t) for t in token_lists], block_size)
        shared = [shared_blocks(token_lists[a], token_lists[b], block_size)
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
    """``(start, end)`` ranges over ``num_rows`` ordered rows, where ``shared[i]`` is what rows
    ``i`` and ``i + 1`` share: each cut in ``[start + target / 2, start + 3 target / 2]`` at
    the smallest share, nearest ``start + target`` on ties."""
    ranges, start = [], 0
    while num_rows - start > target + target // 2:
        lo, hi = start + max(1, target // 2), start + target + target // 2
        cut = min(range(lo, hi + 1), key=lambda c: (shared[c - 1], abs(c - start - target)))
        ranges.append((start, cut))
        start = cut
    if start < num_rows:
        ranges.append((start, num_rows))
    return ranges
