"""Where each token, and each pair of adjacent tokens, occurs in a growing token array: exact
occurrence lists for the suffix decoding proposer, without a tree.

A :class:`TokenIndex` holds token ids at integer positions in one int32 array. Position 0 and
the slots after the last token hold -1, and so does a separator between the sequences a shared
index holds, so a match never crosses a sequence's end. Positions are indexed in runs, each
sorted by (token, next token, position): the occurrences of a token or of a pair are a binary
search per run, and a token's continuations are blocks of its range, counted without a sort.
The newest positions (fewer than ``CHUNK``, and always the last, whose next token is not known
yet) are scanned instead. Runs merge as a binary counter does (a run joins the one before it
while that one is at most twice its size, up to ``MAX_RUN`` positions), so an index of n
positions has O(log n) runs and each position is re-sorted O(log n) times. Sequences leave
from the oldest end only (FIFO eviction): positions before ``live`` are dead; runs wholly dead
are dropped, the oldest run is filtered at each query, and the array drops its dead prefix
once that is half of it.

Memory: 4 bytes per position for the array (plus up to half again of spare capacity) and 16
for the index (an int64 key and an int64 position), ~20-26 bytes per token. numpy, no mlx.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CHUNK = 1024  # scanned positions at most, before they are sorted into a run
MAX_RUN = 1 << 20  # positions past which runs stop merging
MIN_COMPACT = 1 << 16  # dead positions kept before the array drops them
_LOW = 0xFFFFFFFF  # the next token's bits in a key (-1 becomes 2**32 - 1)
_NONE = np.empty(0, np.int64)


class TokenIndex:
    """Token ids by position, with their occurrences indexed (see the module docstring).

    Args:
        reach: How many -1 slots always follow the last token: a reader may look this far
            past any position without a bounds check.
    """

    def __init__(self, reach: int) -> None:
        self.reach = reach
        self.tokens = np.full(CHUNK + reach + 1, -1, np.int32)  # position p at p - base
        self.base = 0
        self.end = 1  # one past the last position; position 0 holds -1
        self.live = 1  # positions before this one were evicted (live - 1 holds -1)
        self._runs: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # lo, hi, keys, pos
        self._indexed = 1  # positions from here on are scanned

    def extend(self, token_ids: Sequence[int] | np.ndarray, separator: bool = False) -> None:
        """Append ``token_ids`` (then a -1 when ``separator``: what follows is a new sequence).

        Raises:
            ValueError: A token id is negative or above 2**31 - 1.
        """
        new = np.asarray(token_ids, dtype=np.int64)
        if new.size and (new.min() < 0 or new.max() > np.iinfo(np.int32).max):
            raise ValueError("token ids must lie in [0, 2**31)")
        size = len(new) + separator
        at = self.end - self.base
        if at + size + self.reach + 1 > len(self.tokens):
            grown = np.full(max(at + size + self.reach + 1, len(self.tokens) * 3 // 2), -1,
                            np.int32)
            grown[:at] = self.tokens[:at]
            self.tokens = grown
        self.tokens[at:at + len(new)] = new
        self.end += size
        if self.end - 1 - self._indexed >= CHUNK:
            self._index_tail()

    def evict_before(self, position: int) -> None:
        """Positions before ``position`` are dead (it must follow a -1 and only grow)."""
        self.live = position
        while self._runs and self._runs[0][1] <= position:
            self._runs.pop(0)
        dead = position - 1 - self.base
        if dead >= MIN_COMPACT and 2 * dead >= self.end - self.base:
            self.tokens = self.tokens[dead:].copy()
            self.base = position - 1

    def count(self, token: int) -> int:
        """How many live positions hold ``token``."""
        total = 0
        for i, (lo, _, keys, pos) in enumerate(self._runs):
            a, b = keys.searchsorted((token << 32, (token + 1) << 32)).tolist()
            if i == 0 and lo < self.live:
                total += int(np.count_nonzero(pos[a:b] >= self.live))
            else:
                total += b - a
        return total + int(np.count_nonzero(self._tail() == token))

    def positions(self, token: int) -> np.ndarray:
        """Live positions holding ``token``, ascending, int64."""
        found = self._find(token << 32, (token + 1) << 32, self._tail() == token)
        found.sort()  # a run's slice is sorted by next token first
        return found

    def pair_positions(self, token: int, next_token: int) -> np.ndarray:
        """Live positions holding ``token`` followed by ``next_token``, ascending, int64."""
        key = (token << 32) | next_token
        start = max(self._indexed, self.live) - self.base
        hit = (self._tail() == token) & (self.tokens[start + 1:self.end + 1 - self.base]
                                         == next_token)
        return self._find(key, key + 1, hit)

    def most_frequent_next(self, token: int) -> tuple[int, int]:
        """The token that most often follows ``token`` (ties: the one that does so first) and
        how often; (-1, 0) if none does."""
        children, counts, firsts = [], [], []
        for i, (lo, _, keys, pos) in enumerate(self._runs):
            a, b = keys.searchsorted((token << 32, (token + 1) << 32)).tolist()
            if a == b:
                continue
            nexts, at = keys[a:b] & _LOW, pos[a:b]
            if i == 0 and lo < self.live:
                alive = at >= self.live
                nexts, at = nexts[alive], at[alive]
            starts = np.flatnonzero(np.diff(nexts, prepend=-1))  # blocks of one next token
            children.append(nexts[starts])
            counts.append(np.diff(starts, append=len(nexts)))
            firsts.append(at[starts])
        start = max(self._indexed, self.live)
        at = np.flatnonzero(self._tail() == token) + start
        if len(at):
            nexts, first, count = np.unique(self.tokens[at + 1 - self.base],
                                            return_index=True, return_counts=True)
            children.append(nexts.astype(np.int64) & _LOW)
            counts.append(count)
            firsts.append(at[first])
        if not children:
            return -1, 0
        child, count, first = (np.concatenate(x) for x in (children, counts, firsts))
        if not len(child):
            return -1, 0
        if len(children) > 1:  # one count per child over all runs
            child, which = np.unique(child, return_inverse=True)
            count = np.bincount(which, weights=count).astype(np.int64)
            earliest = np.full(len(child), np.iinfo(np.int64).max)
            np.minimum.at(earliest, which, first)
            first = earliest
        count[child == _LOW] = 0  # followed by the end of a sequence
        top = count.max()
        if top == 0:
            return -1, 0
        tied = np.flatnonzero(count == top)
        return int(child[tied[np.argmin(first[tied])]]), int(top)

    def _tail(self) -> np.ndarray:
        """The tokens at the scanned positions (from ``max(indexed, live)`` to the end)."""
        return self.tokens[max(self._indexed, self.live) - self.base:self.end - self.base]

    def _find(self, lo_key: int, hi_key: int, tail_hit: np.ndarray) -> np.ndarray:
        """Live positions whose key is in [lo_key, hi_key) (run order) and the scanned ones
        where ``tail_hit``."""
        parts = []
        for _, _, keys, pos in self._runs:
            a, b = keys.searchsorted((lo_key, hi_key)).tolist()
            if a < b:
                parts.append(pos[a:b])
        if tail_hit.any():
            parts.append(np.flatnonzero(tail_hit) + max(self._indexed, self.live))
        if not parts:
            return _NONE.copy()
        found = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        if self._runs and self._runs[0][0] < self.live:
            found = found[found >= self.live]
        return found

    def _index_tail(self) -> None:
        """Sort the scanned positions but the last into a new run, then merge runs."""
        lo, hi = max(self._indexed, self.live), self.end - 1
        if hi <= lo:
            self._indexed = lo
            return
        b = self.base
        keys = ((self.tokens[lo - b:hi - b].astype(np.int64) << 32)
                | (self.tokens[lo + 1 - b:hi + 1 - b].astype(np.int64) & _LOW))
        order = np.argsort(keys, kind="stable")
        self._runs.append((lo, hi, keys[order], order + lo))
        self._indexed = hi
        runs = self._runs
        while len(runs) >= 2:
            (lo1, hi1, keys1, pos1), (lo2, hi2, keys2, pos2) = runs[-2], runs[-1]
            if hi1 - lo1 > 2 * (hi2 - lo2) or hi2 - lo1 > MAX_RUN:
                break
            keys = np.concatenate((keys1, keys2))
            order = np.argsort(keys, kind="stable")  # keeps the older run first on ties
            runs[-2:] = [(lo1, hi2, keys[order], np.concatenate((pos1, pos2))[order])]
