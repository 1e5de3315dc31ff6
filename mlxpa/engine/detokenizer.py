"""Incremental detokenization with stop strings, on mlx-lm's streaming detokenizers.

mlx-lm's ``StreamingDetokenizer`` classes (SPM, BPE, naive) hold back bytes of an incomplete
UTF-8 character, so the text never contains a broken character. On top of that this module
finds the earliest stop string, also when it spans tokens: after each token only the new
text plus ``max(len(stop)) - 1`` characters before it are searched (O(new text) per token).
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Text of one request's output tokens, checked for stop strings as it grows.

    Args:
        tokenizer: An mlx-lm ``TokenizerWrapper`` (its ``detokenizer`` property gives a fresh
            streaming detokenizer).
        stop: Stop strings; the text ends before the earliest match.
        include_stop: End the text after the match instead (``include_stop_str_in_output``).
        min_tokens: Only text produced after this many tokens is searched (vLLM's rule).
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), include_stop: bool = False,
                 min_tokens: int = 0) -> None:
        self._detok = tokenizer.detokenizer
        self.stop = stop
        self.include_stop = include_stop
        self._min_tokens = min_tokens
        self._num_tokens = 0
        self._lookback = max((len(s) for s in stop), default=1) - 1
        self._checked = 0
        self.stop_index: int | None = None
        self.stop_string: str | None = None

    def add_token(self, token: int) -> bool:
        """Append one token; return True when a stop string now appears in the text."""
        self._detok.add_token(token)
        self._num_tokens += 1
        if self._num_tokens < self._min_tokens:
            self._checked = len(self._detok.text) + self._lookback  # never search this text
            return False
        return self._check(self._detok.text)

    def _check(self, text: str) -> bool:
        if not self.stop or self.stop_index is not None:
            return self.stop_index is not None
        start = max(0, self._checked - self._lookback)
        best = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        self._checked = len(text)
        if best is not None:
            self.stop_index, self.stop_string = best
            return True
        return False

    def finalize(self) -> str:
        """Flush held-back bytes; return the final text (cut before a stop string)."""
        self._detok.finalize()
        text = self._detok.text
        if self._num_tokens >= self._min_tokens:
            self._check(text)
        if self.stop_index is None:
            return text
        return text[:self.stop_index + (len(self.stop_string) if self.include_stop else 0)]
