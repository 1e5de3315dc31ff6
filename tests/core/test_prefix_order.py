"""Tests for mlxpa.core.prefix_order: whole-file prefix order and shared-prefix statistics, exact
orders on hand-built prompts and properties checked against a simulated radix tree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.core.prefix_order import SharedPrefix, prefix_order, shared_prefix_stats
from mlxpa.core.radix_cache import RadixCache

BS = 4


def blk(*firsts: int) -> list[int]:
    """One 4-token block per argument: ``blk(1, 5)`` is ``[1, 1, 1, 1, 5, 5, 5, 5]``."""
    return [t for f in firsts for t in [f] * BS]


def test_prefix_order_groups_shared_system_prompts():
    s1, s2 = blk(1, 2), blk(3, 3)
    rows = [s1 + blk(10) + [11], s2 + [20], s1 + blk(12), blk(9), s2 + [21, 22],
            s1 + blk(10) + [13]]
    assert prefix_order(rows, BS) == [0, 5, 2, 1, 4, 3]
    stats = shared_prefix_stats(rows, BS)
    assert stats.num_prompt_tokens == sum(map(len, rows)) == 61
    # Tree blocks: [1] [2] [10] [12] [3] [3] [9] = 7 blocks; tails 1 + 1 + 2 + 1 = 5.
    assert stats.num_unique_tokens == 7 * BS + 5
    assert stats.top_prefixes == [SharedPrefix(12, 2, 0), SharedPrefix(8, 3, 0),
                                  SharedPrefix(8, 2, 1)]
    # Agreeing on a partial block groups nothing: rows keep input order.
    assert prefix_order([s1 + [10, 11], s1 + blk(12), s1 + [10, 13]], BS) == [0, 1, 2]


def test_prefix_order_identical_prompts_and_prefixes():
    rows = [[5, 6, 7], blk(1) + [2], [5, 6, 7], blk(1) + [2]]
    assert prefix_order(rows, BS) == [0, 2, 1, 3]
    assert shared_prefix_stats(rows, BS).top_prefixes == [SharedPrefix(4, 2, 1)]
    # A prompt that is a prefix of another comes first, so the longer one hits its blocks.
    rows = [blk(1, 2, 3), [8], blk(1, 2), blk(1, 2, 3, 4)]
    assert prefix_order(rows, BS) == [2, 0, 3, 1]
    assert shared_prefix_stats(rows, BS, top_k=1).top_prefixes == [SharedPrefix(12, 2, 0)]
    # Agreeing on a partial block groups nothing: only whole blocks are shared.
    assert prefix_order([blk(1) + [5, 6], blk(9), blk(1) + [5, 6, 7, 8]], BS) == [0, 2, 1]
    assert prefix_order([], BS) == [] and shared_prefix_stats([], BS) == (0, 0, [])


prompts = st.lists(st.lists(st.integers(0, 1), max_size=14), max_size=12)


@settings(max_examples=200, deadline=None)
@given(prompts)
def test_prefix_order_properties(rows):
    order = prefix_order(rows, BS)
    assert sorted(order) == list(range(len(rows)))
    pos = {r: i for i, r in enumerate(order)}
    for k in range(1, 4):  # rows sharing k whole blocks are contiguous
        groups: dict[tuple[int, ...], list[int]] = {}
        for r, t in enumerate(rows):
            if len(t) >= k * BS:
                groups.setdefault(tuple(t[:k * BS]), []).append(pos[r])
        for g in groups.values():
            assert max(g) - min(g) == len(g) - 1
    sim = RadixCache(None, BS)
    for t in rows:
        sim.insert(t)
    tails = sum(len(t) % BS for t in rows)
    assert shared_prefix_stats(rows, BS).num_unique_tokens == sim.total_blocks * BS + tails
