"""Incremental detokenization with stop strings, on mlx-lm's streaming detokenizers, and the
stops of a request's new token (:func:`check_stop`: stop strings, grammar endings).

mlx-lm's ``StreamingDetokenizer`` classes (SPM, BPE, naive) hold back bytes of an incomplete
UTF-8 character, so the text never contains a broken character. On top of that this module
finds the earliest stop string, also when it spans tokens: after each token only the new
text plus ``max(len(stop)) - 1`` characters before it are searched (O(new text) per token).
For a request that streams (``DELTA``), :meth:`IncrementalDetokenizer.take_text` hands out the
text no later token can change: a stop string found later starts at most ``max(len(stop)) -
1`` characters before the end of the text searched so far, so holding back that many
characters keeps every piece handed out a prefix of the final text.
"""

from __future__ import annotations

from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request, RequestStatus


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
        self._taken = ""  # the text handed out by take_text
        self.num_tokens_taken = 0  # output tokens handed out in outputs so far (DELTA)

    @property
    def num_tokens(self) -> int:
        """Tokens read so far."""
        return self._num_tokens

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

    def take_text(self) -> str:
        """The text that no later token can change and that was not taken before: the text
        so far without its last ``max(len(stop)) - 1`` characters, which could begin a stop
        string (all of it when there are no stop strings or the matched one is kept); ``""``
        while the text does not extend what was taken (a detokenizer that rewrites its
        tail)."""
        text = self._detok.text
        hold = self._lookback if self.stop and not self.include_stop else 0
        ready = text[:len(text) - hold]
        if len(ready) <= len(self._taken) or not ready.startswith(self._taken):
            return ""
        piece = ready[len(self._taken):]
        self._taken = ready
        return piece

    def rest(self, final_text: str) -> str:
        """What ``final_text`` (:meth:`finalize`'s) holds beyond the text taken."""
        return final_text[len(self._taken):]

    def finalize(self) -> str:
        """Flush held-back bytes; return the final text (cut before a stop string)."""
        self._detok.finalize()
        text = self._detok.text
        if self._num_tokens >= self._min_tokens:
            self._check(text)
        if self.stop_index is None:
            return text
        return text[:self.stop_index + (len(self.stop_string) if self.include_stop else 0)]


def check_stop(req: Request, detok: IncrementalDetokenizer, sched: Scheduler,
               grammar_ended: dict[int, str | None]) -> None:
    """Stop strings (``detok``) and grammar completion or failure of ``req``'s new tokens
    (those ``detok`` has not read: one, or several after accepted draft tokens;
    ``grammar_ended``: the runner's report by request key, :attr:`StepResult.grammar_ended`,
    which concerns the last); a request that stops is finished through ``sched``. A stop
    string completed inside the new tokens drops the tokens after it (sequential decoding
    would have stopped there).

    An EOS sampled below ``min_tokens`` (allowed only when the grammar admitted nothing
    else) that completes the grammar ends the row as an EOS does: ``stop``, no text.
    """
    start = detok.num_tokens
    new = req.output_token_ids[start:]
    for i, tok in enumerate(new[:-1]):
        if detok.add_token(tok):
            end = start + i + 1
            del req.output_token_ids[end:], req.token_times[end:], req.logprobs[end:]
            req.stop_reason = detok.stop_string
            if req.is_finished:  # EOS or max_tokens later in the run: the string came first
                req.status = RequestStatus.FINISHED_STOPPED
            else:
                sched.finish_request(req, RequestStatus.FINISHED_STOPPED)
            return
    if not new:
        return
    tok = new[-1]
    ended = req.key in grammar_ended
    if (not req.is_finished and tok in sched.eos_token_ids and ended
            and grammar_ended[req.key] is None):
        req.stop_reason = tok
        sched.finish_request(req, RequestStatus.FINISHED_STOPPED)
    is_eos = req.stop_reason == tok and req.status == RequestStatus.FINISHED_STOPPED
    if not is_eos and detok.add_token(tok):
        req.stop_reason = detok.stop_string
        if req.is_finished:  # also hit max_tokens: the stop string names the reason
            req.status = RequestStatus.FINISHED_STOPPED
        else:
            sched.finish_request(req, RequestStatus.FINISHED_STOPPED)
    if req.is_finished or not ended:
        return
    if grammar_ended[req.key] is None:  # complete, only EOS may follow: done without it
        sched.finish_request(req, RequestStatus.FINISHED_STOPPED)
    else:
        sched.finish_request(req, RequestStatus.FINISHED_ABORTED)
        req.stop_reason = f"structured output failed: {grammar_ended[req.key]}"
