"""One step's sampling: ``min_tokens`` and grammar masks, per-row sampling, log-probabilities.

Order (vLLM's): the raw logits are kept for log-probabilities; EOS and stop token ids are
masked below ``min_tokens``; each constrained row's grammar bitmask is filled (overlapping the
forward pass, which ``mx.async_eval`` has started) and applied; then
:func:`mlxpa.sampling.sample` draws, and the matchers consume the sampled tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from mlxpa.request import Request, TokenLogprob
from mlxpa.worker.logprobs import gather_logprobs, token_logprobs
from mlxpa.worker.sampling import sample
from mlxpa.worker.structured import Grammars, apply_bitmask


class Sampled(NamedTuple):
    """Sampled tokens of a step's sampling rows.

    Attributes:
        tokens: One token id per row.
        logprobs: Row index to :class:`TokenLogprob`, for rows that ask.
        first_scores: Row index to the log-probability of each ``choice_first_tokens`` entry,
            for choice rows sampling their first token.
    """

    tokens: list[int]
    logprobs: dict[int, TokenLogprob]
    first_scores: dict[int, list[float]]


def mask_early_stops(logits: mx.array, reqs: list[Request], eos_token_ids: list[int]) -> mx.array:
    """EOS and stop token ids get -inf logits in rows that have not yet generated
    ``min_tokens`` tokens (vLLM's ``min_tokens`` rule). ``logits`` is ``[S, V]``, updated. A
    row whose banned ids would cover the whole vocabulary is left as it is (there would be
    nothing to sample).

    Raises:
        IndexError: A banned id is not a column of ``logits`` (the engine refuses such
            requests; a scatter out of range would write another row or crash).
    """
    rows, cols = [], []
    width = logits.shape[-1]
    for i, r in enumerate(reqs):
        sp = r.sampling_params
        if r.num_output_tokens < sp.min_tokens:
            banned = sorted(set(sp.stop_token_ids) | set(eos_token_ids))
            if banned and not 0 <= banned[0] <= banned[-1] < width:
                raise IndexError(f"token ids {banned} outside the logits' {width} columns")
            if len(banned) < width:
                rows.extend([i] * len(banned))
                cols.extend(banned)
    if rows:
        logits[mx.array(rows), mx.array(cols)] = -float("inf")
    return logits


def sample_step(raw: mx.array, reqs: list[Request], seeds: list[int], eos_token_ids: list[int],
                grammars: Grammars | None, pending: list[mx.array]) -> Sampled:
    """Mask, sample and evaluate one step.

    Args:
        raw: ``[S, V]`` logits of the rows that sample (lazy).
        reqs: The ``S`` requests.
        seeds: Per-row seeds.
        eos_token_ids: The model's EOS ids.
        grammars: The constrained rows' matchers (None: no constraints possible).
        pending: Other arrays to evaluate with the tokens (the KV pools).

    Returns:
        The sampled tokens and the asked-for log-probabilities.
    """
    lp_rows = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs]
    first = [i for i, r in enumerate(reqs) if r.choice_first_tokens and not r.output_token_ids]
    logits = raw + 0 if lp_rows or first else raw  # the masks below write into a copy
    logits = mask_early_stops(logits, reqs, eos_token_ids)
    constrained = None
    if grammars is not None and any(r.sampling_params.structured is not None for r in reqs):
        mx.async_eval(logits, *pending)  # the forward pass runs while the masks fill
        constrained = grammars.fill(reqs, logits.shape[-1])
    if constrained is not None:
        logits = apply_bitmask(logits, *constrained)
    toks = sample(logits, [r.sampling_params for r in reqs], seeds,
                  [r.num_output_tokens for r in reqs])
    mx.eval(toks, *pending)
    tokens = toks.tolist()
    if grammars is not None and constrained is not None:
        grammars.advance([reqs[i] for i in constrained[0]],
                         [tokens[i] for i in constrained[0]])
    firsts = {i: gather_logprobs(raw[i], list(reqs[i].choice_first_tokens)) for i in first}
    return Sampled(tokens, token_logprobs(raw, lp_rows, toks, reqs), firsts)
