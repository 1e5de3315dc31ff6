"""One step's sampling: masks, ``logit_bias`` and penalties, sampling, log-probabilities.

Order (vLLM v1's sampler's): the raw logits are kept for log-probabilities; each constrained
request's grammar bitmask is filled (overlapping the forward pass, which ``mx.async_eval`` has
started); EOS and stop token ids are banned below ``min_tokens`` (in the bitmask when there is
one, so the whole mask is one fused pass over the logits); ``logit_bias`` and the repetition,
frequency and presence penalties change the entries of the requests that set them
(:mod:`mlxpa.worker.penalties`: one gather, evaluated with the forward pass, and one scatter
for all rows); then :func:`mlxpa.worker.sampling.sample` draws (temperature, top-k, top-p,
min-p; greedy rows take the argmax), and the matchers consume the sampled tokens.

``min_tokens`` never empties a request's row of logits: when the ban would leave no token to
sample (the grammar admits only EOS or stop ids, or the ids cover the vocabulary), the row
keeps what it allowed, and a grammar that is complete ends the request (vLLM's rule since
vllm-project/vllm#54218: the grammar is authoritative over ``min_tokens``).
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from mlxpa.request import Request, TokenLogprob
from mlxpa.structured.mask import apply_bitmask, ban_in_bitmask
from mlxpa.structured.matchers import Grammars
from mlxpa.worker.logprobs import token_logprobs
from mlxpa.worker.penalties import PenaltyState, apply_penalties, gather_entries
from mlxpa.worker.sampling import sample


class Sampled(NamedTuple):
    """What a step's sampling requests produced (row ``i`` is the ``i``-th request).

    Attributes:
        tokens: One token id per request.
        logprobs: Row to the sampled token's :class:`TokenLogprob`, for requests that ask.
        grammar_ended: The constrained requests whose grammar ended with their token: None
            when complete, else the error (:meth:`Grammars.advance`).
        mask_time_s: Seconds spent filling the grammar bitmask, None when none was filled.
    """

    tokens: list[int]
    logprobs: dict[int, TokenLogprob]
    grammar_ended: dict[Request, str | None]
    mask_time_s: float | None


def early_stop_bans(reqs: list[Request], eos_token_ids: list[int],
                    width: int) -> dict[int, list[int]]:
    """EOS and stop token ids banned for each request that has not yet generated
    ``min_tokens`` tokens (vLLM's ``min_tokens`` rule).

    Returns:
        Row (index in ``reqs``) to its sorted banned ids (rows without a ban are absent).

    Raises:
        IndexError: A banned id is not below ``width`` (the engine refuses such requests; a
            scatter out of range would write another row or crash).
    """
    bans = {}
    for i, r in enumerate(reqs):
        sp = r.sampling_params
        if r.num_output_tokens < sp.min_tokens:
            banned = sorted(set(sp.stop_token_ids) | set(eos_token_ids))
            if banned and not 0 <= banned[0] <= banned[-1] < width:
                raise IndexError(f"token ids {banned} outside the logits' {width} columns")
            if banned:
                bans[i] = banned
    return bans


def mask_early_stops(logits: mx.array, reqs: list[Request], eos_token_ids: list[int]) -> mx.array:
    """EOS and stop token ids get -inf logits in rows that have not yet generated
    ``min_tokens`` tokens. ``logits`` is ``[S, V]``, updated. A row whose banned ids would
    cover the whole vocabulary is left as it is (there would be nothing to sample).

    Raises:
        IndexError: As :func:`early_stop_bans`.
    """
    width = logits.shape[-1]
    bans = {i: ids for i, ids in early_stop_bans(reqs, eos_token_ids, width).items()
            if len(ids) < width}
    rows = [i for i, ids in bans.items() for _ in ids]
    if rows:
        logits[mx.array(rows), mx.array([t for ids in bans.values() for t in ids])] = -mx.inf
    return logits


def sample_step(parts: list[mx.array], reqs: list[Request], seeds: list[int],
                eos_token_ids: list[int], grammars: Grammars | None,
                pending: list[mx.array], penalties: PenaltyState | None = None) -> Sampled:
    """Mask, penalise, sample and evaluate one step.

    Args:
        parts: ``[S_k, V]`` logits of the requests that sample, per forward group (lazy),
            concatenated in order to the step's ``[S, V]`` raw logits; the list is emptied,
            so that nothing else holds them and the mask may write into their buffer when no
            request reads the raw logits afterwards (MLX donates such a buffer).
        reqs: The ``S`` requests.
        seeds: Per-request seeds.
        eos_token_ids: The model's EOS ids.
        grammars: The constrained requests' matchers (None: no constraints possible); the
            bitmask is ``grammars.vocab_size`` wide.
        pending: Other arrays to evaluate with the tokens (the KV pools, the step's other
            log-probability reads).
        penalties: The runner's ``logit_bias`` and penalty entries (None: no request of the
            step can set them).

    Returns:
        The sampled tokens, the asked-for log-probabilities and the grammar endings.
    """
    raw = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    parts.clear()
    lp_rows = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None]
    bitmask = entries = None
    constrained = grammars is not None and any(
        r.sampling_params.structured_outputs is not None for r in reqs)
    if constrained or (penalties is not None and any(
            r.sampling_params.penalised for r in reqs)):
        mx.async_eval(raw, *pending)  # the forward pass runs while the host works
        bitmask = grammars.fill(reqs) if constrained else None
        entries = penalties.step(reqs) if penalties is not None else None
        mx.synchronize()  # the finished async evaluation lets go of the raw logits
    if bitmask is not None:
        ban_in_bitmask(bitmask.words, early_stop_bans(reqs, eos_token_ids, grammars.vocab_size))
        logits = apply_bitmask(raw, bitmask.words)
    else:  # the scatter writes into a copy when the raw logits are read below
        logits = mask_early_stops(raw + 0 if lp_rows else raw, reqs, eos_token_ids)
    if not lp_rows:
        raw = None  # the mask's output may take over the raw logits' buffer
    if entries is not None:
        values = gather_entries(logits, entries)
        mx.eval(values)  # now nothing but `logits` holds the masked logits: scatter in place
        logits = apply_penalties(logits, values, entries)
    toks = sample(logits, [r.sampling_params for r in reqs], seeds,
                  [r.num_output_tokens for r in reqs])
    mx.eval(toks, *pending)
    tokens = toks.tolist()
    ended = {} if bitmask is None else grammars.advance(
        [reqs[i] for i in bitmask.rows], [tokens[i] for i in bitmask.rows])
    logprobs = {}
    if lp_rows:
        idx = mx.array(lp_rows)
        values = token_logprobs(raw[idx], toks[idx],
                                [reqs[i].sampling_params.logprobs for i in lp_rows], ranks=True)
        logprobs = dict(zip(lp_rows, values))
    return Sampled(tokens, logprobs, ended,
                   None if bitmask is None else bitmask.fill_s)
