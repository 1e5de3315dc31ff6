"""NgramProposer against a brute-force scan of every earlier position (vLLM's rule: the
longest n in [min, max] whose suffix occurred before, its earliest occurrence), on hand-checked
contexts and on random ones fed token by token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.spec_decode.ngram import NgramProposer


def brute_draft(tokens: list[int], low: int, high: int, k: int) -> list[int]:
    """Scan all starts: the first n from high down whose suffix occurs at a start s with
    s + n <= len - 1 (a token follows it); the earliest such s proposes what follows."""
    total = len(tokens)
    for n in range(high, low - 1, -1):
        for s in range(total - n):
            if tokens[s:s + n] == tokens[total - n:]:
                return tokens[s + n:s + n + k]
    return []


def propose_once(tokens: list[int], low: int, high: int, k: int) -> list[int]:
    proposer = NgramProposer(low, high)
    proposer.add_request(0, tokens)
    return proposer.propose(0, tokens, k)


@pytest.mark.parametrize("tokens, low, high, k, draft", [
    ([1, 2, 3, 4, 1, 2], 2, 4, 4, [3, 4, 1, 2]),   # [1, 2] at 0; 4 tokens follow it
    ([1, 2, 3, 4, 1, 2], 2, 4, 2, [3, 4]),
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),      # vLLM's docstring example: 3 left
    ([5, 1, 2, 7, 1, 2, 8, 1, 2], 2, 2, 3, [7, 1, 2]),  # the earliest of two occurrences
    ([1, 2, 5, 3, 1, 2, 8, 3, 1, 2], 2, 3, 2, [8, 3]),  # [3, 1, 2] beats an earlier [1, 2]
    ([1, 2, 9, 4, 1, 2, 7, 3, 1, 2], 2, 3, 2, [9, 4]),  # no earlier [3, 1, 2]: [1, 2]
    ([1, 1, 1], 2, 2, 4, [1]),                      # overlaps the suffix: one token follows
    ([1, 2, 3, 4], 2, 4, 4, []),                    # no repeat
    ([1, 2, 3, 2], 2, 4, 4, []),                    # [2] repeats, but n >= 2
    ([1, 2, 3, 2], 1, 4, 4, [3, 2]),
    ([7], 1, 1, 4, []),
    ([], 1, 1, 4, []),
])
def test_hand_checked_drafts(tokens, low, high, k, draft):
    assert brute_draft(tokens, low, high, k) == draft
    assert propose_once(tokens, low, high, k) == draft


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=40), low=st.integers(1, 4),
       extra=st.integers(0, 3), k=st.integers(1, 8), data=st.data())
def test_token_by_token_equals_brute_force(tokens, low, extra, k, data):
    high = low + extra
    split = data.draw(st.integers(0, len(tokens)))
    proposer = NgramProposer(low, high)
    proposer.add_request(7, tokens[:split])
    for n in range(split, len(tokens) + 1):
        context = tokens[:n]
        assert proposer.propose(7, context, k) == brute_draft(context, low, high, k)
    # Fed in steps or built at once: the same index.
    assert propose_once(tokens, low, high, k) == brute_draft(tokens, low, high, k)


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=30), k=st.integers(1, 8))
def test_large_token_ids_pack_without_collisions(tokens, k):
    tokens = tokens + tokens[: len(tokens) // 2]  # repeats, with ids using all 32 bits
    assert propose_once(tokens, 1, 3, k) == brute_draft(tokens, 1, 3, k)


def test_large_ids_differing_in_high_bits_do_not_match():
    a, b = 2**32 - 1, 2**31 - 1  # equal low 31 bits
    assert propose_once([a, 5, 6, b], 1, 2, 2) == []
    assert propose_once([a, 5, 6, a], 1, 2, 2) == [5, 6]


def test_requests_see_only_their_own_tokens():
    proposer = NgramProposer(2, 2)
    proposer.add_request(1, [4, 5, 6, 7, 8])
    proposer.add_request(2, [9, 4, 5])
    assert proposer.propose(2, [9, 4, 5], 3) == []  # [4, 5, 6] is request 1's
    proposer.finish_request(1, [6, 7, 8])
    assert proposer.propose(2, [9, 4, 5], 3) == []  # nothing is shared after it ends either
    assert proposer.propose(2, [9, 4, 5, 1, 4, 5], 3) == [1, 4, 5]


def test_k_below_one_and_errors():
    proposer = NgramProposer(1, 2)
    proposer.add_request(0, [1, 2, 1])
    assert proposer.propose(0, [1, 2, 1], 0) == []
    with pytest.raises(ValueError, match="already tracked"):
        proposer.add_request(0, [])
    with pytest.raises(KeyError):
        proposer.propose(3, [1], 2)
    proposer.finish_request(0, None)
    with pytest.raises(KeyError):
        proposer.finish_request(0, None)
    for low, high in ((0, 2), (3, 2)):
        with pytest.raises(ValueError, match="prompt_lookup"):
            NgramProposer(low, high)
