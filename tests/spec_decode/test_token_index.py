"""TokenIndex against a plain list of its live tokens: every query equals a brute-force scan,
through appends, separators, runs merging and FIFO eviction (small CHUNK / MAX_RUN /
MIN_COMPACT so a few dozen tokens cross every threshold)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxpa.spec_decode.token_index as token_index
from mlxpa.spec_decode.token_index import TokenIndex


def small_thresholds(chunk: int):
    """Patch the index's thresholds so that small inputs build, merge and compact runs."""
    patches = [mock.patch.object(token_index, "CHUNK", chunk),
               mock.patch.object(token_index, "MAX_RUN", 12),
               mock.patch.object(token_index, "MIN_COMPACT", 2)]
    for p in patches:
        p.start()
    return patches


def live_tokens(index: TokenIndex) -> dict[int, int]:
    """Position -> token of every live position (what the index should answer from)."""
    return {p: int(index.tokens[p - index.base]) for p in range(index.live, index.end)}


def brute_most_frequent_next(live: dict[int, int], token: int) -> tuple[int, int]:
    counts: dict[int, int] = {}
    for p in sorted(live):
        nxt = live.get(p + 1, -1)
        if live[p] == token and nxt >= 0:
            counts[nxt] = counts.get(nxt, 0) + 1  # first seen first: ties go to it
    if not counts:
        return -1, 0
    top = max(counts, key=counts.__getitem__)
    return top, counts[top]


def check_queries(index: TokenIndex, alphabet: int) -> None:
    live = live_tokens(index)
    for a in range(alphabet):
        at = [p for p in sorted(live) if live[p] == a]
        assert index.count(a) == len(at)
        assert index.positions(a).tolist() == at
        assert index.most_frequent_next(a) == brute_most_frequent_next(live, a)
        for b in range(alphabet):
            pairs = [p for p in at if live.get(p + 1) == b]
            assert index.pair_positions(a, b).tolist() == pairs


operations = st.lists(st.tuples(st.sampled_from(["extend", "sequence", "evict"]),
                                st.lists(st.integers(0, 3), max_size=9)), max_size=14)


@settings(max_examples=150, deadline=None)
@given(ops=operations, chunk=st.sampled_from([1, 2, 5, 1024]))
def test_queries_equal_a_scan_through_appends_and_evictions(ops, chunk):
    patches = small_thresholds(chunk)
    try:
        index = TokenIndex(reach=4)
        starts: list[int] = []  # first position of each separated sequence still live
        for op, tokens in ops:
            if op == "extend":
                index.extend(tokens)
            elif op == "sequence":
                starts.append(index.end)
                index.extend(tokens, separator=True)
            elif len(starts) >= 2:
                starts.pop(0)
                index.evict_before(starts[0])
            check_queries(index, 4)
            assert (index.tokens[index.end - index.base:][:index.reach] == -1).all()
    finally:
        for p in patches:
            p.stop()


def test_eviction_drops_old_positions_and_compacts():
    patches = small_thresholds(2)
    try:
        index = TokenIndex(reach=3)
        starts = []
        for seq in ([1, 2, 1], [2, 2], [1, 3, 1, 2], [3, 3]):
            starts.append(index.end)
            index.extend(seq, separator=True)
        index.evict_before(starts[2])
        assert index.base == 0  # 7 dead positions of 16: kept
        assert index.positions(1).tolist() == [starts[2], starts[2] + 2]
        assert index.count(2) == 1
        assert index.most_frequent_next(1) == (3, 1)  # 3 first: ties go to the earliest
        assert index.pair_positions(2, 2).tolist() == []
        index.evict_before(starts[3])
        assert index.base == starts[3] - 1  # 12 of 16 dead: dropped
        assert index.positions(3).tolist() == [starts[3], starts[3] + 1]
        assert index.count(1) == 0
        assert index.most_frequent_next(3) == (3, 1)
        assert index.pair_positions(3, 3).tolist() == [starts[3]]
    finally:
        for p in patches:
            p.stop()


def test_token_ids_out_of_range_are_refused():
    index = TokenIndex(reach=2)
    with pytest.raises(ValueError, match="token ids"):
        index.extend([1, -1])
    with pytest.raises(ValueError, match="token ids"):
        index.extend(np.array([2**31], np.int64))
    index.extend([5, 6])
    assert index.positions(5).tolist() == [1]
