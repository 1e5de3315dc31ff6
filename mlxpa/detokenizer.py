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
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._detok = tokenizer.detokenizer
        self.stop = stop
        self._lookback = max((len(s) for s in stop), default=1) - 1
        self._checked = 0
        self.stop_index: int | None = None
        self.stop_string: str | None = None

    def add_token(self, token: int) -> bool:
        """Append one token; return True when a stop string now appears in the text."""
        self._detok.add_token(token)
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
        self._check(text)
        return text if self.stop_index is None else text[:self.stop_index]
