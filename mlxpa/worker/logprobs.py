"""Log-probabilities of sampled, scored and target tokens, only for the requests that ask.

Values are the model's own ``log_softmax`` of the raw logits, before the grammar mask,
``min_tokens`` and the sampling filters (temperature, top-p/k, min-p): vLLM's default
``raw_logprobs`` mode. A log-softmax over Gemma 3's 262,144-token vocabulary is the costliest op
of a CPU step, so requests that do not ask never pay for it.

Three uses share :func:`token_logprobs`: each sampled token of a request with ``logprobs``; each
scored prompt token (:attr:`~mlxpa.request.Request.num_scored_tokens`: the logits at position
``p - 1`` score the prompt token at ``p``, as vLLM's ``prompt_logprobs``), with its
``scored_top_logprobs`` alternatives; and :func:`gather_logprobs` reads the
``target_token_ids`` at a request's first sampled position.
"""

from __future__ import annotations

import mlx.core as mx

from mlxpa.request import Request, TokenLogprob


def log_softmax(logits: mx.array) -> mx.array:
    """``[R, V]`` float32 log-probabilities of ``[R, V]`` logits (any float dtype)."""
    x = logits.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def token_logprobs(logits: mx.array, token_ids: list[int] | mx.array,
                   num_top: list[int]) -> list[TokenLogprob]:
    """The log-probability of one token per row, with the row's most likely tokens.

    Args:
        logits: ``[R, V]`` raw logits.
        token_ids: ``[R]`` token ids (a list or an int array), one per row.
        num_top: Per row, how many most likely ``(token_id, logprob)`` pairs to return.

    Returns:
        Per row, the :class:`TokenLogprob` of its token (``top``: most likely first; ``rank``:
        how many tokens are at least as likely, vLLM's rank).
    """
    if not num_top:
        return []
    lp = log_softmax(logits)
    ids = token_ids if isinstance(token_ids, mx.array) else mx.array(token_ids)
    chosen = mx.take_along_axis(lp, ids[:, None].astype(mx.int32), axis=-1)[:, 0]
    ranks = (lp >= chosen[:, None]).sum(axis=-1)
    k = max(num_top)
    top_ids = top_lp = None
    if k > 0:
        top_ids = mx.argpartition(-lp, k - 1, axis=-1)[:, :k]
        top_lp = mx.take_along_axis(lp, top_ids, axis=-1)
        order = mx.argsort(-top_lp, axis=-1)
        top_ids = mx.take_along_axis(top_ids, order, axis=-1)
        top_lp = mx.take_along_axis(top_lp, order, axis=-1)
    mx.eval(chosen, ranks, *([top_ids, top_lp] if k > 0 else []))
    chosen_l, tok_l, rank_l = chosen.tolist(), ids.tolist(), ranks.tolist()
    ids_l = top_ids.tolist() if top_ids is not None else None
    lps_l = top_lp.tolist() if top_lp is not None else None
    return [TokenLogprob(int(tok_l[r]), float(chosen_l[r]),
                         tuple(zip(ids_l[r][:n], lps_l[r][:n])) if n else (), int(rank_l[r]))
            for r, n in enumerate(num_top)]


def gather_logprobs(logits: mx.array, token_ids: list[int]) -> list[float]:
    """``log_softmax(logits)[token_ids]`` of one ``[V]`` row of logits."""
    lp = log_softmax(logits[None])[0]
    return lp[mx.array(token_ids)].tolist()


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
