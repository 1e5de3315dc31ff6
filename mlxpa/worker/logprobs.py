"""Log-probabilities of sampled, scored and target tokens, only for the requests that ask.

Values are the model's own ``log_softmax`` of the raw logits, before the grammar mask,
``min_tokens`` and the sampling filters (temperature, top-p/k, min-p): vLLM's default
``raw_logprobs`` mode. A log-softmax over Gemma 3's 262,144-token vocabulary is the costliest op
of a CPU step, so requests that do not ask never pay for it.

Three uses share :class:`LogprobGather`: each sampled token of a request with ``logprobs``
(:func:`token_logprobs`); each scored prompt token
(:attr:`~mlxpa.request.Request.num_scored_tokens`: the logits at position ``p - 1`` score the
prompt token at ``p``, as vLLM's ``prompt_logprobs``), with its ``scored_top_logprobs``
alternatives and its rank (:func:`scored_logprobs`); and the ``target_token_ids`` read from
the logits of a request's last prompt token, with the same alternatives.

Scored positions can be a whole prefill chunk: 2,048 positions of Gemma 3's 262,144-token
vocabulary are 2 GiB of float32 logits, and the log-softmax and top-k need as much again.
:func:`scored_logprobs` therefore applies the LM head and the log-softmax to at most
:data:`SCORE_SLICE_BYTES` of logits at a time, evaluating each slice before the next, so
the peak stays a few slices' worth whatever the chunk (a model without a body/head split
computes its logits at every position anyway).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxpa.request import Request, TokenLogprob

# Most bytes of float32 logits one slice of scored positions takes (64 MiB: 64 positions of
# a 262,144-token vocabulary); the slice's log-softmax and top-k take about three times more.
SCORE_SLICE_BYTES = 64 * 2**20


def log_softmax(logits: mx.array) -> mx.array:
    """``[R, V]`` float32 log-probabilities of ``[R, V]`` logits (any float dtype)."""
    x = logits.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


class LogprobGather:
    """Log-probabilities of ``(row, token id)`` pairs of ``[R, V]`` raw logits, each with
    its row's most likely tokens, built lazily: evaluate :attr:`arrays` (with the step's
    other arrays, in its one ``mx.eval``), then read :meth:`values`.

    Args:
        logits: ``[R, V]`` raw logits (any float dtype).
        rows: ``[P]`` the row of each pair.
        token_ids: ``[P]`` the token id of each pair (a list or an int array).
        num_top: ``[P]`` how many most likely ``(token_id, logprob)`` pairs of its row each
            pair carries.
        ranks: Also give each pair's rank: how many tokens of the vocabulary are at least as
            likely, itself included (vLLM's ``Logprob.rank``, 1 = most likely).
    """

    def __init__(self, logits: mx.array, rows: list[int], token_ids: list[int] | mx.array,
                 num_top: list[int], ranks: bool = False) -> None:
        self._rows, self._num_top = rows, num_top
        lp = log_softmax(logits)
        ids = token_ids if isinstance(token_ids, mx.array) else mx.array(token_ids)
        self._ids = ids.astype(mx.int32)
        self._chosen = lp[mx.array(rows), self._ids] if rows else None
        self._rank = None
        if ranks and rows:
            self._rank = (lp[mx.array(rows)] >= self._chosen[:, None]).sum(axis=-1)
        self._top_ids = self._top_lp = None
        k = max(num_top, default=0)
        if k > 0:
            top_ids = mx.argpartition(-lp, k - 1, axis=-1)[:, :k]
            top_lp = mx.take_along_axis(lp, top_ids, axis=-1)
            order = mx.argsort(-top_lp, axis=-1)
            self._top_ids = mx.take_along_axis(top_ids, order, axis=-1)
            self._top_lp = mx.take_along_axis(top_lp, order, axis=-1)

    @property
    def arrays(self) -> list[mx.array]:
        """The lazy arrays to evaluate."""
        return [a for a in (self._chosen, self._ids, self._rank, self._top_ids, self._top_lp)
                if a is not None]

    def values(self) -> list[TokenLogprob]:
        """Per pair, its :class:`TokenLogprob` (``top``: most likely first)."""
        if self._chosen is None:
            return []
        chosen, ids = self._chosen.tolist(), self._ids.tolist()
        top_ids = self._top_ids.tolist() if self._top_ids is not None else None
        top_lp = self._top_lp.tolist() if self._top_lp is not None else None
        rank = self._rank.tolist() if self._rank is not None else [None] * len(chosen)
        return [TokenLogprob(int(ids[p]), float(chosen[p]),
                             tuple(zip(top_ids[r][:n], top_lp[r][:n])) if n else (), rank[p])
                for p, (r, n) in enumerate(zip(self._rows, self._num_top))]


def token_logprobs(logits: mx.array, token_ids: list[int] | mx.array,
                   num_top: list[int], ranks: bool = False) -> list[TokenLogprob]:
    """The log-probability of one token per row, with the row's most likely tokens.

    Args:
        logits: ``[R, V]`` raw logits.
        token_ids: ``[R]`` token ids (a list or an int array), one per row.
        num_top: Per row, how many most likely ``(token_id, logprob)`` pairs to return.
        ranks: Also give each token's rank: how many tokens of the vocabulary are at least
            as likely, itself included (vLLM's ``Logprob.rank``, 1 = most likely).

    Returns:
        Per row, the :class:`TokenLogprob` of its token (``top``: most likely first; ``rank``:
        how many tokens are at least as likely, vLLM's rank).
    """
    if not num_top:
        return []
    gather = LogprobGather(logits, list(range(len(num_top))), token_ids, num_top, ranks)
    mx.eval(*gather.arrays)
    return gather.values()


def scored_logprobs(features: mx.array, head: Callable[[mx.array], mx.array], width: int,
                    token_ids: list[int], num_top: list[int]) -> list[TokenLogprob]:
    """:func:`token_logprobs` (with ranks) of scored positions, the LM head applied in slices
    of at most :data:`SCORE_SLICE_BYTES` of float32 logits, each evaluated before the next.

    Args:
        features: ``[N, H]`` the head's inputs at the scored positions (evaluated), or
            ``[N, V]`` logits (``head`` is then the identity).
        head: Turns ``[n, H]`` features into ``[n, V]`` logits.
        width: ``V``, the logits' width.
        token_ids: ``[N]`` the scored token ids.
        num_top: Per position, how many alternatives to return.
    """
    step = max(1, SCORE_SLICE_BYTES // (4 * width))
    values: list[TokenLogprob] = []
    for start in range(0, len(token_ids), step):
        end = start + step
        values += token_logprobs(head(features[start:end]), token_ids[start:end],
                                 num_top[start:end], ranks=True)
    return values


def score_columns(req: Request, start: int, num_tokens: int) -> list[tuple[int, int, int]]:
    """Columns of a scheduled chunk whose logits score a prompt token of ``req``.

    Args:
        req: A request; only its ``num_scored_tokens`` last prompt tokens are scored.
        start: First position of the chunk (``num_computed_tokens``).
        num_tokens: Tokens in the chunk.

    Returns:
        ``(column in the chunk, target token id, target position)`` triples: the logits at
        position ``p - 1`` score the prompt token at ``p`` for every scored position ``p``.
    """
    n = req.num_scored_tokens
    if n == 0:
        return []
    total = req.num_prompt_tokens
    first = max(start, total - n - 1)
    last = min(start + num_tokens, total - 1)  # exclusive: position total-1 predicts nothing
    return [(i - start, req.prompt_token_ids[i + 1], i + 1) for i in range(first, last)]
