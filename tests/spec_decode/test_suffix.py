"""SuffixDecodingProposer against a brute-force oracle: Arctic's path speculation
(``SuffixTree::speculate`` / ``_speculate_path``) written out over plain lists, every
occurrence of a pattern found by comparing slices, no TokenIndex. Checked on hand-worked
contexts and on random requests that start, grow, finish or abort while others run: small
vocabularies so matches abound, small index thresholds so a few dozen tokens sort, merge and
compact runs, and streams past the real CHUNK (1024)."""

from __future__ import annotations

import contextlib
import math
import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxpa.spec_decode.suffix as suffix
import mlxpa.spec_decode.token_index as token_index
from mlxpa.spec_decode.suffix import SuffixDecodingProposer

# --- the oracle ----------------------------------------------------------------------------


def occurrences(seqs: list[list[int]], pattern: list[int]) -> list[tuple[int, int]]:
    """(sequence, start) of every occurrence of ``pattern``, oldest sequence first, then by
    position; an occurrence lies inside one sequence (never across an output's end)."""
    n = len(pattern)
    return [(s, i) for s, seq in enumerate(seqs) for i in range(len(seq) - n + 1)
            if seq[i:i + n] == pattern]


def greedy_path(seqs: list[list[int]], pattern: list[int], cap: int,
                min_prob: float) -> tuple[float, list[int]]:
    """(score, draft) from ``pattern``: at most ``cap`` times take the continuation x with the
    largest count(p + x) (ties: the earliest occurrence), prob *= count(p + x) / count(p),
    stop below ``min_prob``. count(p) counts occurrences without a continuation too (the end
    of a sequence: in the request's own tokens, the context's suffix itself)."""
    p, prob, score, draft = list(pattern), 1.0, 0.0, []
    while len(draft) < cap:
        found = occurrences(seqs, p)
        nexts: dict[int, int] = {}  # first seen first: max() then takes the earliest on ties
        for s, i in found:
            if i + len(p) < len(seqs[s]):
                x = seqs[s][i + len(p)]
                nexts[x] = nexts.get(x, 0) + 1
        if not nexts:
            break
        x = max(nexts, key=nexts.__getitem__)
        prob *= nexts[x] / len(found)
        if prob < min_prob:
            break
        draft.append(x)
        score += prob
        p.append(x)
    return score, draft


def speculate(seqs: list[list[int]], context: list[int], k: int, depth: int, factor: float,
              min_prob: float) -> tuple[float, list[int]]:
    """Arctic's ``SuffixTree::speculate`` (path mode) over ``seqs``: the best draft over match
    lengths 1 .. len(context) - 1 while the match occurs; ties go to the longer match."""
    best: tuple[float, list[int]] = (0.0, [])
    for m in range(1, len(context)):
        pattern = context[-m:]
        if not occurrences(seqs, pattern):
            break
        # Arctic's tree holds patterns of at most ``depth`` tokens: a draft from a match of m
        # tokens ends there.
        cap = min(k, math.floor(m * factor + 1e-6), depth - m)
        score, draft = greedy_path(seqs, pattern, cap, min_prob)
        if score >= best[0]:
            best = (score, draft)
    return best


class Oracle:
    """What the proposer should answer from: a request's own tokens (given per call) and the
    last ``cached`` non-empty outputs of requests that finished, oldest first."""

    def __init__(self, depth: int, cached: int, factor: float, min_prob: float) -> None:
        self.depth, self.cached, self.factor, self.min_prob = depth, cached, factor, min_prob
        self.outputs: list[list[int]] = []

    def finish(self, output: list[int] | None) -> None:
        if self.cached and output:
            self.outputs.append(list(output))
            del self.outputs[:-self.cached]  # FIFO

    def propose(self, tokens: list[int], k: int) -> list[int]:
        if k < 1:
            return []
        context = list(tokens[-self.depth:])
        args = (context, k, self.depth, self.factor, self.min_prob)
        own = speculate([list(tokens)], *args)
        shared = speculate(self.outputs, *args)
        return shared[1] if shared[0] > own[0] else own[1]  # ties: the request's own


@contextlib.contextmanager
def thresholds(chunk: int = token_index.CHUNK, small: int = suffix._SMALL,
               memo: int = suffix._MEMO_SIZE):
    """Patch the index's and the proposer's thresholds (read at call time) so that a few
    dozen tokens build, merge and compact runs, and count occurrences either way."""
    tiny = chunk < token_index.CHUNK
    with mock.patch.object(token_index, "CHUNK", chunk), \
            mock.patch.object(token_index, "MAX_RUN", 16 if tiny else token_index.MAX_RUN), \
            mock.patch.object(token_index, "MIN_COMPACT", 2 if tiny else token_index.MIN_COMPACT), \
            mock.patch.object(suffix, "_SMALL", small), \
            mock.patch.object(suffix, "_MEMO_SIZE", memo):
        yield


# --- hand-worked drafts --------------------------------------------------------------------


def test_hand_worked_example():
    # Own tokens 1 2 3 1 2 4 1 2 (k=3, depth 8, factor 1, min prob 0.1):
    #   m=1, p=[2]: at 1, 4, 7 (7 is the context's own end: no continuation); count 3;
    #       [2,3] and [2,4] once each: a tie, 3 occurs first; cap min(3, 1, 7) = 1:
    #       [3] at prob 1/3, score 1/3.
    #   m=2, p=[1,2]: at 0, 3, 6; count 3; 3 (1/3); cap 2; [1,2,3] at 0 only, then 1 (prob
    #       1/3 * 1/1): [3, 1], score 2/3.
    #   m=3, p=[4,1,2]: only the context's own: no draft (so every longer m too).
    # Best: [3, 1] (2/3).
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]
    proposer = SuffixDecodingProposer(8, 2, 1.0, 0.1)
    oracle = Oracle(8, 2, 1.0, 0.1)
    proposer.add_request(0, tokens)
    assert proposer.propose(0, tokens, 3) == oracle.propose(tokens, 3) == [3, 1]
    # A finished output 4 1 2 5 5: p=[2] once, then 5 (prob 1): [5], score 1; p=[1,2]:
    # [5, 5], score 2; p=[4,1,2] (cap 3): [5, 5] then the output's end, score 2 (a tie: the
    # longer match); p=[2,4,1,2] does not occur. 2 > 2/3: the shared draft wins.
    proposer.add_request(1, [4, 1, 2])
    proposer.finish_request(1, [5, 5])  # its output is 5 5 only: the prompt is not shared
    oracle.finish([5, 5])
    assert proposer.propose(0, tokens, 3) == oracle.propose(tokens, 3) == [3, 1]
    proposer.add_request(2, [9])
    proposer.finish_request(2, [4, 1, 2, 5, 5])
    oracle.finish([4, 1, 2, 5, 5])
    assert proposer.propose(0, tokens, 3) == oracle.propose(tokens, 3) == [5, 5]
    # At min prob 0.5, with no outputs kept, the own drafts (first prob 1/3) are cut.
    strict = SuffixDecodingProposer(8, 2, 1.0, 0.5)
    strict.add_request(0, tokens)
    assert strict.propose(0, tokens, 3) == []


@pytest.mark.parametrize("tokens, outputs, k, depth, factor, min_prob, draft", [
    # p=[2] at 0,2,5,8: 5 twice of 4 (1/2); p=[3,2] at 4,7: 6 once of 2 (1/2): with k=1 a
    # tie of scores, the longer match wins.
    ([2, 5, 2, 5, 3, 2, 6, 3, 2], [], 1, 8, 1.0, 0.1, [6]),
    # k=2: p=[3,2] goes on to [3,2,6] then 3 (1/2 + 1/2 = 1) over [2] -> 5 (1/2).
    ([2, 5, 2, 5, 3, 2, 6, 3, 2], [], 2, 8, 1.0, 0.1, [6, 3]),
    # Own [7,8] -> 9 (1/2) -> 7 (1/2): score 1; shared [8] -> 6 (1): score 1. Tie: own.
    ([7, 8, 9, 7, 8], [[8, 6]], 4, 8, 1.0, 0.1, [9, 7]),
    # Shared [7,8] -> 6 -> 6 (score 2) beats own (1).
    ([7, 8, 9, 7, 8], [[8, 6], [7, 8, 6, 6]], 4, 8, 1.0, 0.1, [6, 6]),
    # The outputs 1 2 | 3 4 5: no match runs across their boundary.
    ([0, 2], [[1, 2], [3, 4, 5]], 4, 8, 1.0, 0.1, []),  # across: [2] -> 3
    ([0, 2, 3], [[1, 2], [3, 4, 5]], 4, 8, 1.0, 0.1, [4]),  # across: [2, 3] -> 4 5
    # depth 3: context 2 3 1; m=2 caps at min(4, 2, 3 - 2) = 1.
    ([1, 2, 3, 1, 2, 3, 1], [], 4, 3, 1.0, 0.1, [2]),
    # m=3 and m=4 (both twice): 2, 3, 1 at 1/2 each, 1.5 over m=2's [2, 3] (1).
    ([1, 2, 3, 1, 2, 3, 1], [], 4, 8, 1.0, 0.1, [2, 3, 1]),
    ([1, 2, 3, 1, 2, 3, 1], [], 4, 8, 0.5, 0.1, [2, 3]),  # factor 1/2: m=4 drafts 2
    ([1, 2, 3, 1, 2, 3, 1], [], 4, 8, 0.0, 0.1, []),
    # min prob 1: only certain continuations ([1] -> 2 at 2 of 3 occurrences is cut).
    ([1, 2, 1, 2, 1], [], 4, 2, 1.0, 1.0, []),
    ([1, 2, 1, 2, 1], [], 4, 3, 1.0, 1.0, []),
    ([5, 1, 2], [[1, 2, 3]], 4, 8, 1.0, 1.0, [3]),
    ([7], [[7, 7, 7]], 4, 8, 1.0, 0.1, []),  # a one-token context matches nothing
    ([], [[7, 7, 7]], 4, 8, 1.0, 0.1, []),
])
def test_hand_checked_drafts(tokens, outputs, k, depth, factor, min_prob, draft):
    oracle = Oracle(depth, 4, factor, min_prob)
    proposer = SuffixDecodingProposer(depth, 4, factor, min_prob)
    for key, output in enumerate(outputs, 1):
        oracle.finish(output)
        proposer.add_request(key, [])
        proposer.finish_request(key, output)
    proposer.add_request(0, tokens)
    assert oracle.propose(tokens, k) == draft
    assert proposer.propose(0, tokens, k) == draft


# --- random requests ------------------------------------------------------------------------


def run_requests(data, vocab: int, depth: int, cached: int, factor: float, min_prob: float,
                 steps: int) -> None:
    """Requests start, grow (random tokens, copies of earlier material, accepted drafts),
    finish or abort, interleaved; every draft equals the oracle's."""
    proposer = SuffixDecodingProposer(depth, cached, factor, min_prob)
    oracle = Oracle(depth, cached, factor, min_prob)
    running: dict[int, tuple[int, list[int]]] = {}  # key -> (prompt length, tokens)
    tokens_of = st.lists(st.integers(0, vocab - 1), max_size=6)

    def material() -> list[int]:
        sources = oracle.outputs + [tokens for _, tokens in running.values()]
        if sources and data.draw(st.booleans()):  # a copy: long matches
            src = data.draw(st.sampled_from(sources))
            a = data.draw(st.integers(0, len(src)))
            return src[a:a + data.draw(st.integers(0, 12))]
        return data.draw(tokens_of)

    for _ in range(steps):
        op = data.draw(st.sampled_from(("add", "step", "step", "step", "finish")))
        if op == "add" or not running:
            key = min(set(range(len(running) + 1)) - running.keys())  # reuses finished keys
            prompt = material() + data.draw(tokens_of)
            proposer.add_request(key, prompt)
            running[key] = (len(prompt), list(prompt))
        elif op == "step":
            key = data.draw(st.sampled_from(sorted(running)))
            tokens = running[key][1]
            tokens += material()
            k = data.draw(st.integers(0, 6))
            draft = proposer.propose(key, list(tokens), k)
            assert draft == oracle.propose(tokens, k), (key, tokens, k, oracle.outputs)
            tokens += draft[:data.draw(st.integers(0, len(draft)))]  # accepted, unseen yet
        else:
            key = data.draw(st.sampled_from(sorted(running)))
            prompt_len, tokens = running.pop(key)
            output = None if data.draw(st.booleans()) else tokens[prompt_len:]  # None: abort
            proposer.finish_request(key, output)
            oracle.finish(output)
        assert proposer.num_cached_requests == len(oracle.outputs)


@settings(max_examples=250, deadline=None)
@given(vocab=st.integers(2, 6), depth=st.integers(1, 9), cached=st.integers(0, 3),
       factor=st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5, 2.0, 8.0]),
       min_prob=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]),
       chunk=st.sampled_from([1, 2, 3, 8, 1024]), small=st.sampled_from([0, 3, 32]),
       memo=st.sampled_from([1, 4096]), data=st.data())
def test_random_requests_equal_the_oracle(vocab, depth, cached, factor, min_prob, chunk,
                                          small, memo, data):
    with thresholds(chunk, small, memo):
        run_requests(data, vocab, depth, cached, factor, min_prob, steps=30)


@pytest.mark.parametrize("seed, vocab", [(0, 3), (1, 5)])
def test_long_streams_at_the_real_chunk_size(seed, vocab):
    """Requests and cached outputs past 1024 and 2048 tokens (runs sorted, then merged) at the
    real thresholds, with outputs evicted from under the shared index's runs."""
    rng = random.Random(seed)
    depth, cached, k = 6, 2, 4
    proposer = SuffixDecodingProposer(depth, cached, 1.0, 0.1)
    oracle = Oracle(depth, cached, 1.0, 0.1)

    def grow(tokens: list[int], n: int) -> list[int]:
        while n > 0:
            if len(tokens) > 8 and rng.random() < 0.3:  # repeat an earlier span
                a = rng.randrange(len(tokens) - 8)
                piece = tokens[a:a + rng.randint(2, 8)]
            else:
                piece = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
            tokens += piece[:n]
            n -= len(piece)
        return tokens

    for key, (prompt_len, output_len) in enumerate([(300, 700), (50, 900), (10, 1100)]):
        tokens = grow([], prompt_len)
        proposer.add_request(key, tokens)
        grow(tokens, output_len)
        proposer.finish_request(key, tokens[prompt_len:])
        oracle.finish(tokens[prompt_len:])
    assert proposer.num_cached_requests == 2
    tokens = grow([], 700)
    proposer.add_request(9, tokens)
    while len(tokens) < 2300:
        grow(tokens, rng.randint(40, 90))
        draft = proposer.propose(9, list(tokens), k)
        assert draft == oracle.propose(tokens, k)
        tokens += draft[:rng.randint(0, len(draft))]


# --- what is shared, and what is not --------------------------------------------------------


def test_running_requests_share_nothing():
    proposer = SuffixDecodingProposer(8, 10)
    proposer.add_request(1, [4, 5, 6, 7, 8])
    proposer.add_request(2, [9, 4, 5])
    assert proposer.propose(2, [9, 4, 5], 3) == []  # [4, 5, 6] is running request 1's
    assert proposer.propose(1, [4, 5, 6, 7, 8, 4, 5], 3) == [6, 7]  # its own, to itself
    assert proposer.propose(2, [9, 4, 5, 6], 3) == []
    proposer.finish_request(1, [6, 7, 8, 4, 5, 6, 7])  # its output is shared, not its prompt
    assert proposer.propose(2, [9, 4, 5, 6], 3) == [7]  # [4, 5, 6] -> 7 in the output
    proposer.add_request(3, [1, 9])
    assert proposer.propose(3, [1, 9], 3) == []  # request 2's [9, 4, 5, 6] is still running


def test_aborted_requests_share_nothing():
    proposer = SuffixDecodingProposer(8, 10)
    proposer.add_request(1, [3, 1, 2])
    proposer.add_request(2, [1, 2])
    assert proposer.propose(1, [3, 1, 2, 7, 8, 9, 1, 2], 3) == [7, 8]
    proposer.finish_request(1, None)
    assert proposer.num_cached_requests == 0
    assert proposer.propose(2, [1, 2], 3) == []
    proposer.add_request(1, [5])  # the key is free again
    proposer.finish_request(1, [])  # an empty output is not kept either
    assert proposer.num_cached_requests == 0
    proposer.add_request(3, [])
    proposer.finish_request(3, [1, 2, 4])
    assert proposer.propose(2, [1, 2], 3) == [4]


def test_eviction_is_fifo_and_forgets_memoized_drafts():
    proposer = SuffixDecodingProposer(8, 2)
    for key, output in enumerate(([5, 1, 2, 3], [6, 1, 2, 4], [7, 1, 2, 4])):
        proposer.add_request(key, [])
        proposer.finish_request(key, output)
    assert proposer.num_cached_requests == 2
    proposer.add_request(9, [0, 5, 1, 2])
    assert proposer.propose(9, [0, 5, 1, 2], 3) == [4]  # [5, 1, 2] -> 3 was evicted first
    proposer.add_request(8, [1, 2])
    assert proposer.propose(8, [1, 2], 3) == [4]
    proposer.add_request(10, [])
    proposer.finish_request(10, [1, 2, 3])  # evicts [6, 1, 2, 4]
    assert proposer.propose(8, [1, 2], 3) == [4]  # 4 and 3 once each: the older output's
    proposer.add_request(11, [])
    proposer.finish_request(11, [9, 9])  # no 2 in it, but it evicts [7, 1, 2, 4]
    assert proposer.propose(8, [1, 2], 3) == [3]  # not the memoized [4]
    off = SuffixDecodingProposer(8, 0)  # nothing kept
    off.add_request(0, [])
    off.finish_request(0, [1, 2, 3])
    off.add_request(1, [1, 2])
    assert off.num_cached_requests == 0 and off.propose(1, [1, 2], 3) == []


def test_token_ids_as_arrays_and_large_ids():
    big = 2**31 - 1
    proposer = SuffixDecodingProposer(8, 4, 4.0)
    proposer.add_request(0, np.array([big, 5], np.int64))
    proposer.finish_request(0, np.array([big, 5, big, 6, big, 5], np.int64))
    assert proposer._shared.changed.nbytes <= 1 << 20  # not a slot per possible token id
    proposer.add_request(1, [3, big])
    # [big] -> 5 (2/3), [big, 5] -> big (2/3 * 1/2), [big, 5, big] -> 6 (1/3).
    assert proposer.propose(1, np.array([3, big]), 3) == [5, big, 6]
    with pytest.raises(ValueError, match="token ids"):
        proposer.add_request(2, [2**31])


# --- errors ---------------------------------------------------------------------------------


def test_k_below_one_and_errors():
    proposer = SuffixDecodingProposer(4, 2)
    proposer.add_request(0, [1, 2, 1, 2])
    assert proposer.propose(0, [1, 2, 1, 2], 0) == []
    assert proposer.propose(0, [1, 2, 1, 2], -1) == []
    assert proposer.propose(0, [1, 2, 1, 2, 1], 2) == [2, 1]
    with pytest.raises(ValueError, match="already tracked"):
        proposer.add_request(0, [])
    with pytest.raises(ValueError, match="held before"):
        proposer.propose(0, [1, 2], 2)  # shorter than what it holds
    with pytest.raises(KeyError):
        proposer.propose(3, [1], 2)
    with pytest.raises(KeyError):
        proposer.finish_request(3, [1])
    proposer.finish_request(0, None)
    with pytest.raises(KeyError):
        proposer.finish_request(0, None)
    with pytest.raises(KeyError):
        proposer.propose(0, [1, 2, 1, 2, 1], 2)
    for args in ((0, 1, 1.0, 0.1), (1, -1, 1.0, 0.1), (1, 1, -0.5, 0.1), (1, 1, 1.0, -0.1),
                 (1, 1, 1.0, 1.5)):
        with pytest.raises(ValueError, match="out of range"):
            SuffixDecodingProposer(*args)
