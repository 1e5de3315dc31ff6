"""Prompt lookup decoding (vLLM v1's ``ngram`` method): the longest recent n-gram that occurred
earlier in the request's own prompt and output proposes the tokens that followed it there.

vLLM scans the whole context on every step (KMP); here each request keeps a dict from n-gram to
the end of its first occurrence, updated as tokens arrive (O(prompt_lookup_max) per token), so
a proposal is at most ``prompt_lookup_max - prompt_lookup_min + 1`` dict lookups whatever the
context length. An n-gram key is its tokens packed into one int, 32 bits a token under a
marker bit: smaller than a tuple and quicker to hash. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

_BITS = 32  # bits per token in a packed n-gram key (token ids are below 2**32)


class NgramProposer:
    """vLLM v1's ``NgramProposer`` (``vllm/v1/spec_decode/ngram_proposer.py``), indexed.

    For a context t[0:T] (prompt + output so far) it tries n = ``prompt_lookup_max`` down to
    ``prompt_lookup_min``: the first n whose suffix t[T-n:T] also occurs ending at some e <=
    T - 2 (any earlier occurrence; it may overlap the suffix) proposes t[e+1 : e+1+k], fewer
    where the context ends first. Of several occurrences the earliest is used, as vLLM's KMP
    scan picks (it keeps the leftmost occurrence of the longest match). No match: no draft.

    Memory: up to ``prompt_lookup_max - prompt_lookup_min + 1`` dict entries per context
    token (one per new n-gram), ~80 bytes each (``benchmarks/proposer_cost.py``).

    Args:
        prompt_lookup_min: Shortest n-gram tried (>= 1).
        prompt_lookup_max: Longest n-gram tried (>= ``prompt_lookup_min``).

    Raises:
        ValueError: The lengths are out of range.
    """

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min ({prompt_lookup_min}) <= "
                             f"prompt_lookup_max ({prompt_lookup_max})")
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self._requests: dict[int, _NgramIndex] = {}

    def add_request(self, key: int, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking request ``key`` and index its prompt.

        Raises:
            ValueError: ``key`` is already tracked.
        """
        if key in self._requests:
            raise ValueError(f"request key {key} is already tracked")
        index = _NgramIndex(self.min_n, self.max_n)
        index.extend(prompt_token_ids, len(prompt_token_ids) - 1)
        self._requests[key] = index

    def propose(self, key: int, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``token_ids`` (prompt + output so far; token ids
        in [0, 2**32)). Raises KeyError for an untracked ``key``."""
        index = self._requests[key]
        total = len(token_ids)
        index.extend(token_ids, total - 1)
        if k < 1 or total < 2:
            return []
        end = index.lookup(token_ids[total - 1], min(self.max_n, total - 1))
        return [] if end is None else list(token_ids[end + 1:end + 1 + k])

    def finish_request(self, key: int, output_token_ids: Sequence[int] | None) -> None:
        """Stop tracking ``key`` (nothing is shared across requests). Raises KeyError for an
        untracked ``key``."""
        del self._requests[key]


class _NgramIndex:
    """One request's n-grams of lengths min_n..max_n, each mapped to the end position of its
    first occurrence; holds those ending before ``indexed``."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.firsts: list[dict[int, int]] = [{} for _ in range(max_n + 1)]  # [n]: key -> end
        self.masks = [(1 << (_BITS * n)) - 1 for n in range(max_n + 1)]
        self.marks = [1 << (_BITS * n) for n in range(max_n + 1)]
        self.window = 0  # the last max_n indexed tokens packed (the newest lowest)
        self.indexed = 0

    def extend(self, token_ids: Sequence[int], stop: int) -> None:
        """Index the n-grams ending at positions ``indexed .. stop - 1``."""
        if stop <= self.indexed:
            return
        min_n, max_n, masks, marks, firsts = (self.min_n, self.max_n, self.masks, self.marks,
                                              self.firsts)
        window, mask = self.window, masks[max_n]
        for end in range(self.indexed, stop):
            window = ((window << _BITS) | token_ids[end]) & mask
            for n in range(min_n, min(max_n, end + 1) + 1):
                firsts[n].setdefault((window & masks[n]) | marks[n], end)
        self.window, self.indexed = window, stop

    def lookup(self, last: int, longest: int) -> int | None:
        """End position of the first occurrence of the longest indexed suffix of length
        ``longest`` down to min_n, the context's suffix being the indexed tokens + ``last``."""
        window = (self.window << _BITS) | last
        for n in range(longest, self.min_n - 1, -1):
            end = self.firsts[n].get((window & self.masks[n]) | self.marks[n])
            if end is not None:
                return end
        return None
