"""Log-probabilities of generated and scored tokens, only for the rows that ask.

Values are the model's own ``log_softmax`` of the raw logits, before the grammar mask,
``min_tokens`` and the sampling filters (temperature, top-p/k, min-p): vLLM's default
``raw_logprobs`` mode. A log-softmax over Gemma 3's 262,144-token vocabulary is the costliest op
of a CPU step, so rows that do not ask never pay for it.
"""

from __future__ import annotations

import mlx.core as mx

from mlxpa.request import Request, TokenLogprob


def log_softmax(logits: mx.array) -> mx.array:
    """``[R, V]`` float32 log-probabilities of ``[R, V]`` logits (any float dtype)."""
    x = logits.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def wants_logprobs(req: Request) -> bool:
    """Whether ``req`` returns per-token log-probabilities."""
    return req.sampling_params.logprobs


def token_logprobs(logits: mx.array, rows: list[int], tokens: mx.array,
                   reqs: list[Request]) -> dict[int, TokenLogprob]:
    """Log-probabilities of the sampled tokens of rows ``rows``.

    Args:
        logits: ``[S, V]`` raw logits of the step's sampling rows.
        rows: Indices of the rows that ask (``reqs[i]`` for row ``i``).
        tokens: ``[S]`` sampled token ids.
        reqs: The ``S`` requests (their ``top_logprobs``).

    Returns:
        Row index to :class:`TokenLogprob` (with the ``top_logprobs`` most likely tokens).
    """
    if not rows:
        return {}
    idx = mx.array(rows)
    lp = log_softmax(logits[idx])
    chosen = mx.take_along_axis(lp, tokens[idx][:, None].astype(mx.int32), axis=-1)[:, 0]
    k = max(reqs[i].sampling_params.top_logprobs for i in rows)
    top_ids = top_lp = None
    if k > 0:
        top_ids = mx.argpartition(-lp, k - 1, axis=-1)[:, :k]
        top_lp = mx.take_along_axis(lp, top_ids, axis=-1)
        order = mx.argsort(-top_lp, axis=-1)
        top_ids = mx.take_along_axis(top_ids, order, axis=-1)
        top_lp = mx.take_along_axis(top_lp, order, axis=-1)
        mx.eval(chosen, top_ids, top_lp)
    chosen_l, tok_l = chosen.tolist(), tokens[idx].tolist()
    ids_l = top_ids.tolist() if top_ids is not None else None
    lps_l = top_lp.tolist() if top_lp is not None else None
    result = {}
    for j, i in enumerate(rows):
        n = reqs[i].sampling_params.top_logprobs
        top = tuple(zip(ids_l[j][:n], lps_l[j][:n])) if n and ids_l is not None else ()
        result[i] = TokenLogprob(int(tok_l[j]), float(chosen_l[j]), top)
    return result


def gather_logprobs(logits: mx.array, token_ids: list[int]) -> list[float]:
    """``log_softmax(logits)[token_ids]`` of one ``[V]`` row of logits."""
    lp = log_softmax(logits[None])[0]
    return lp[mx.array(token_ids)].tolist()


def target_logprobs(logits: mx.array, targets: list[int]) -> list[float]:
    """``log_softmax(logits)[r, targets[r]]`` for every row ``r`` of ``[R, V]`` logits."""
    if not targets:
        return []
    lp = log_softmax(logits)
    picked = mx.take_along_axis(lp, mx.array(targets)[:, None], axis=-1)[:, 0]
    return picked.tolist()


def score_columns(req: Request, start: int, num_tokens: int) -> list[tuple[int, int, int]]:
    """Columns of a scheduled chunk whose logits score a token of ``req``.

    Args:
        req: A scoring request (``num_scored_tokens > 0``), else nothing is scored.
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
