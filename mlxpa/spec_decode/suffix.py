"""Suffix decoding (Oliaro et al., "SuffixDecoding", arXiv 2411.04975), as Arctic Inference
implements it and vLLM's ``suffix`` method calls it: the context's recent suffix is matched
in the request's own prompt and output and in the outputs of earlier finished requests, and
the most frequent continuation is proposed while its estimated probability holds up.

Arctic keeps suffix trees (C++); a Python tree of depth 24 costs kilobytes per token. Here
the same counts come from occurrence lists: a pattern's count is how often it occurs, a
continuation's probability that count over its parent's, which are what Arctic's tree nodes
hold (its ``count`` is the suffixes through a node: the pattern's occurrences). Occurrences
come from :class:`~mlxpa.spec_decode.token_index.TokenIndex`, one per running request and
one shared one over finished outputs. numpy, no mlx.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from mlxpa.spec_decode.token_index import TokenIndex

_SMALL = 32  # occurrence sets up to this size are counted in Python, larger ones in numpy
_MEMO_SIZE = 4096  # shared speculation results memoized at most (then the memo restarts)
_BUCKETS = 1 << 16  # token ids share the memo's change marks modulo this (ids reach 2**31)


class SuffixDecodingProposer:
    """Arctic Inference's ``SuffixDecodingCache.speculate`` in path mode (its
    ``SuffixTree::speculate`` and ``_speculate_path``), under vLLM's option names.

    Two structures are searched: the request's prompt + output so far, and the outputs of
    the last ``max_cached_requests`` requests that finished with an output (oldest evicted
    first; empty outputs are not kept). A running request's tokens reach no other request:
    an output is shared at ``finish_request``, never while it runs (Arctic shares outputs of
    running requests as they grow), and an aborted request shares nothing.

    In each structure, with c = the last ``max_tree_depth`` tokens of the context and
    count(p) = occurrences of pattern p (|p| <= ``max_tree_depth``; in the request's own
    structure, the context's suffix itself is one): for each match length m = 1 ..
    len(c) - 1 while count(c[-m:]) > 0, start at p = c[-m:] and prob = 1, and repeat at most
    min(k, floor(m * ``max_spec_factor`` + 1e-6), ``max_tree_depth`` - m) times (Arctic's
    tree ends at that depth): take the continuation x with the largest count(p + x) (ties:
    the one occurring earliest; Arctic's pick depends on its tree's layout: its sibling
    list's head, or in later versions its children map's order), set prob *= count(p + x) /
    count(p), stop if prob < ``min_token_prob``, else draft x and p = p + x. A draft's score
    is the sum of its tokens' prob; the best score over m wins (ties: the longer m), then the
    better structure (ties: the request's own), as in Arctic. Probabilities are float64
    (Arctic: float32).

    Cost (``benchmarks/proposer_cost.py``, 2-core VM): ~20-30 bytes per context token;
    ``add_request`` of an 8k-token prompt ~1 ms; ``propose`` at 8k context and depth 24
    ~0.1-0.3 ms on text-like tokens (more where one token is most of the context).

    Args:
        max_tree_depth: Longest pattern + draft counted (>= 1).
        max_cached_requests: Finished outputs kept for other requests (0: none).
        max_spec_factor: At most this many draft tokens per matched token (>= 0).
        min_token_prob: Smallest estimated probability a draft token may have, in [0, 1].

    Raises:
        ValueError: An argument is out of range.
    """

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1) -> None:
        if max_tree_depth < 1 or max_cached_requests < 0 or max_spec_factor < 0 \
                or not 0 <= min_token_prob <= 1:
            raise ValueError(f"out of range: max_tree_depth={max_tree_depth} (>= 1), "
                             f"max_cached_requests={max_cached_requests} (>= 0), "
                             f"max_spec_factor={max_spec_factor} (>= 0), "
                             f"min_token_prob={min_token_prob} (in [0, 1])")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self._requests: dict[int, TokenIndex] = {}
        self._shared = (_SharedOutputs(max_cached_requests, max_tree_depth + 1)
                        if max_cached_requests else None)

    @property
    def num_cached_requests(self) -> int:
        """Finished outputs the shared structure holds."""
        return len(self._shared.starts) if self._shared is not None else 0

    def add_request(self, key: int, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking request ``key`` and index its prompt.

        Raises:
            ValueError: ``key`` is already tracked, or a token id is outside [0, 2**31).
        """
        if key in self._requests:
            raise ValueError(f"request key {key} is already tracked")
        index = TokenIndex(self.max_tree_depth + 1)
        index.extend(prompt_token_ids)
        self._requests[key] = index

    def propose(self, key: int, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``token_ids`` (prompt + output so far).

        Raises:
            KeyError: ``key`` is not tracked.
            ValueError: ``token_ids`` is shorter than what the request already held, or a
                token id is outside [0, 2**31).
        """
        index = self._requests[key]
        held = index.end - 1
        if len(token_ids) < held:
            raise ValueError(f"request {key}: {len(token_ids)} token ids, {held} held before")
        if len(token_ids) > held:
            index.extend(token_ids[held:])
        if k < 1:
            return []
        context = [int(t) for t in token_ids[-self.max_tree_depth:]]
        score, draft = self._speculate(index, context, k, 1)
        shared = self._shared
        if shared is not None:
            memo_key = (k, *context)
            found = shared.recall(memo_key)
            if found is None:
                found = self._speculate(shared.index, context, k, 0)
                shared.remember(memo_key, found)
            if found[0] > score:
                return list(found[1])
        return draft

    def finish_request(self, key: int, output_token_ids: Sequence[int] | None) -> None:
        """Stop tracking ``key``; keep a non-empty output for later requests (oldest evicted
        past ``max_cached_requests``), nothing for None.

        Raises:
            KeyError: ``key`` is not tracked.
        """
        del self._requests[key]
        if self._shared is not None and output_token_ids is not None \
                and len(output_token_ids):
            self._shared.add(output_token_ids)

    def _speculate(self, index: TokenIndex, context: list[int], k: int,
                   floor: int) -> tuple[float, list[int]]:
        """(score, draft) of the best match length in ``index``; ``floor`` occurrences of a
        pattern have no continuation (1 in the request's own index: the context itself)."""
        last = len(context) - 1
        if last < 1:
            return 0.0, []
        best: tuple[float, list[int]] = (0.0, [])
        n1 = index.count(context[-1])
        if n1 <= floor:
            return best
        m = 1
        occ = index.pair_positions(context[-2], context[-1]) + 1 if last > 1 else None
        if occ is None or len(occ) < n1:  # match length 1 has occurrences of its own
            best = self._draft_group(index, None, context[-1], n1, 1, 1, k, best)
            m = 2
        tokens, base = index.tokens, index.base
        while occ is not None and len(occ) > floor:
            first, shorter = m, None
            while m < last:  # longer matches while the occurrence set stays the same
                longer = occ[tokens[occ - (m + base)] == context[-m - 1]]
                if len(longer) < len(occ):
                    shorter = longer
                    break
                m += 1
            best = self._draft_group(index, occ, context[-1], len(occ), first, m, k, best)
            occ, m = shorter, m + 1
        return best

    def _draft_group(self, index: TokenIndex, occ: np.ndarray | None, token: int, count: int,
                     first: int, last: int, k: int,
                     best: tuple[float, list[int]]) -> tuple[float, list[int]]:
        """The best of ``best`` and the drafts of match lengths ``first..last``, which share
        one occurrence set (``occ``: end positions, ascending; None: every position holding
        ``token``; ``count`` of them): one path, cut per length."""
        caps = [min(k, int(m * self.max_spec_factor + 1e-6), self.max_tree_depth - m)
                for m in range(first, last + 1)]
        draft, probs = self._follow(index, occ, token, count, max(caps))
        scores = [0.0]
        for prob in probs:
            scores.append(scores[-1] + prob)
        for cap in caps:
            n = min(cap, len(draft))
            if scores[n] >= best[0]:
                best = (scores[n], draft[:n])
        return best

    def _follow(self, index: TokenIndex, occ: np.ndarray | None, token: int, count: int,
                cap: int) -> tuple[list[int], list[float]]:
        """Up to ``cap`` most frequent continuations of a pattern (``occ`` etc. as in
        :meth:`_draft_group`) and each one's running probability."""
        draft: list[int] = []
        probs: list[float] = []
        if cap < 1:
            return draft, probs
        prob, min_prob = 1.0, self.min_token_prob
        if occ is None:  # the first step from the index's counts of next tokens
            child, child_count = index.most_frequent_next(token)
            prob = child_count / count
            if child_count == 0 or prob < min_prob:
                return draft, probs
            draft.append(child)
            probs.append(prob)
            occ = index.pair_positions(token, child) + 1
        tokens, base = index.tokens, index.base
        while len(draft) < cap:
            n = len(occ)
            if n == 1:  # one occurrence: its continuation, at probability ratio 1
                start = int(occ[0]) + 1 - base
                for token in tokens[start:start + cap - len(draft)].tolist():
                    if token < 0:
                        break
                    draft.append(token)
                    probs.append(prob)
                break
            nexts = tokens[occ + (1 - base)]
            token, count, same = _most_frequent(nexts)
            if count == 0:
                break
            prob *= count / n
            if prob < min_prob:
                break
            draft.append(token)
            probs.append(prob)
            occ = occ[same] + 1
        return draft, probs


class _SharedOutputs:
    """The outputs of finished requests in one :class:`TokenIndex` (at most ``max_outputs``,
    oldest evicted), and a memo of speculation results over it.

    A memo entry (keyed by k and the context) holds while no output holding the context's
    last token has come or gone since: every pattern the result counts ends in that token.
    A request looping on a few tokens, or rows repeating one another, then pay for a
    context's counts once, however many occurrences the loop has left here.
    """

    def __init__(self, max_outputs: int, reach: int) -> None:
        self.max_outputs = max_outputs
        self.index = TokenIndex(reach)
        self.starts: deque[int] = deque()  # first position of each output, oldest first
        self.version = 0  # changes so far
        # [token % _BUCKETS]: the change that last added/evicted a token there (ids sharing a
        # slot only forget memo entries early)
        self.changed = np.zeros(_BUCKETS, np.int64)
        self.memo: dict[tuple[int, ...], tuple[int, tuple[float, list[int]]]] = {}

    def add(self, output_token_ids: Sequence[int]) -> None:
        """Keep a finished output, evicting the oldest past ``max_outputs``."""
        index = self.index
        self.starts.append(index.end)
        index.extend(output_token_ids, separator=True)
        self._changed(index.tokens[self.starts[-1] - index.base:index.end - 1 - index.base])
        if len(self.starts) > self.max_outputs:
            old = self.starts.popleft()
            self._changed(index.tokens[old - index.base:self.starts[0] - 1 - index.base])
            index.evict_before(self.starts[0])

    def recall(self, key: tuple[int, ...]) -> tuple[float, list[int]] | None:
        """The memo's result for ``key`` (k, *context), if it still holds."""
        entry = self.memo.get(key)
        if entry is None:
            return None
        if self.changed[key[-1] % _BUCKETS] > entry[0]:
            return None
        return entry[1]

    def remember(self, key: tuple[int, ...], result: tuple[float, list[int]]) -> None:
        """Memoize ``result`` for ``key`` at the current version."""
        if len(self.memo) >= _MEMO_SIZE:
            self.memo.clear()
        self.memo[key] = (self.version, result)

    def _changed(self, tokens: np.ndarray) -> None:
        self.version += 1
        self.changed[tokens % _BUCKETS] = self.version


def _most_frequent(values: np.ndarray) -> tuple[int, int, np.ndarray | None]:
    """The most frequent non-negative value (ties: the first), its count, and where it is."""
    if len(values) <= _SMALL:
        counts: dict[int, int] = {}
        for v in values.tolist():
            if v >= 0:
                counts[v] = counts.get(v, 0) + 1
        if not counts:
            return -1, 0, None
        top = max(counts, key=counts.__getitem__)  # the first maximum: the earliest
        return top, counts[top], values == top
    first = values[0]
    same = values == first
    count = int(np.count_nonzero(same))
    if first >= 0 and 2 * count > len(values):  # a majority is the mode
        return int(first), count, same
    uniq, starts, counts = np.unique(values, return_index=True, return_counts=True)
    if uniq[0] < 0:
        counts[0] = 0
    top = counts.max()
    if top == 0:
        return -1, 0, None
    tied = np.flatnonzero(counts == top)
    i = int(tied[np.argmin(starts[tied])])
    token = int(uniq[i])
    return token, int(top), values == token
