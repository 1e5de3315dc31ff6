"""One step's sampling: ``min_tokens`` and grammar masks, per-row sampling, log-probabilities.

Order (vLLM's): the raw logits are kept for log-probabilities; each constrained row's grammar
bitmask is filled (overlapping the forward pass, which ``mx.async_eval`` has started); EOS and
stop token ids are banned below ``min_tokens`` (in the bitmask when there is one, so the whole
mask is one fused pass over the logits); then :func:`mlxpa.sampling.sample` draws, and the
matchers consume the sampled tokens.

``min_tokens`` never empties a row: when the ban would leave no token to sample (the grammar
admits only EOS or stop ids, or the ids cover the vocabulary), the row keeps what it allowed,
and a grammar that is complete ends the row (vLLM's rule since vllm-project/vllm#54218: the
grammar is authoritative over ``min_tokens``).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.request import Request, TokenLogprob
from mlxpa.worker.logprobs import gather_logprobs, token_logprobs
from mlxpa.worker.sampling import sample
from mlxpa.worker.structured import Grammars


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


def early_stop_bans(reqs: list[Request], eos_token_ids: list[int],
                    width: int) -> dict[int, list[int]]:
    """EOS and stop token ids banned in each row that has not yet generated ``min_tokens``
    tokens (vLLM's ``min_tokens`` rule).

    Returns:
        Row index to its sorted banned ids (rows without a ban are absent).

    Raises:
        IndexError: A banned id is not a column of the ``width``-wide logits (the engine
            refuses such requests; a scatter out of range would write another row or crash).
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


@partial(mx.compile, shapeless=True)
def _keep_allowed(words: mx.array, logits: mx.array) -> mx.array:
    """``[S, W, 1]`` int32 words, ``[S, W, 32]`` logits: the logit where its bit is set, else
    ``-inf`` (one fused pass)."""
    bits = (words >> mx.arange(32, dtype=mx.int32)) & 1
    return mx.where(bits.astype(mx.bool_), logits, -mx.inf)


def apply_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """Set the logits of disallowed tokens to ``-inf``, in one fused MLX pass over all rows
    (the bits are expanded inside the kernel; nothing ``[S, V]``-sized is unpacked, gathered
    or scattered: on 2 x86 cores, 128 rows x 262,144 tokens cost a fifth of numpy unpacking
    followed by a gather, ``where`` and scatter). The result may take over ``logits``' buffer
    when nothing else holds it.

    Semantics are llguidance's (``llguidance.numpy.apply_token_bitmask_inplace``): columns
    past ``32 * W`` are disallowed, bits past ``V`` are ignored.

    Args:
        logits: ``[S, V]`` logits (any float dtype).
        bitmask: ``[S, W]`` int32, bit ``t % 32`` of word ``t // 32`` set = token ``t``
            allowed (llguidance's layout; a row of ``-1`` words leaves its row unchanged).

    Returns:
        ``[S, V]`` logits of ``logits``' dtype (a new array).

    Raises:
        ValueError: ``bitmask`` has another number of rows than ``logits``.
    """
    s, v = logits.shape
    if bitmask.shape[0] != s:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {s} rows of logits")
    w = -(-v // 32)
    words = bitmask[:, :w]
    if words.shape[1] < w:  # a narrower bitmask disallows the columns it does not cover
        words = np.pad(words, ((0, 0), (0, w - words.shape[1])))
    if 32 * w != v:
        logits = mx.pad(logits, ((0, 0), (0, 32 * w - v)))
    out = _keep_allowed(mx.array(words).reshape(s, w, 1), logits.reshape(s, w, 32))
    out = out.reshape(s, 32 * w)
    return out if 32 * w == v else out[:, :v]


def ban_in_bitmask(bitmask: np.ndarray, bans: dict[int, list[int]]) -> None:
    """Clear the bits of each row's banned ids in an llguidance bitmask (``[S, W]`` int32,
    bit ``t % 32`` of word ``t // 32``), in place, except in a row where that would clear
    every bit: that row keeps what it allowed."""
    words = bitmask.view(np.uint32)
    for row, ids in bans.items():
        t = np.asarray(ids, dtype=np.int64)
        cols = t >> 5
        kept = words[row, cols].copy()
        np.bitwise_and.at(words[row], cols, ~(np.uint32(1) << (t & 31).astype(np.uint32)))
        if not words[row].any():
            words[row, cols] = kept


def sample_step(parts: list[mx.array], reqs: list[Request], seeds: list[int],
                eos_token_ids: list[int], grammars: Grammars | None,
                pending: list[mx.array]) -> Sampled:
    """Mask, sample and evaluate one step.

    Args:
        parts: ``[S_k, V]`` logits of the rows that sample, per forward group (lazy),
            concatenated in order to the step's ``[S, V]`` raw logits; the list is emptied,
            so that nothing else holds them and the mask may write into their buffer when no
            row reads the raw logits afterwards (MLX donates such a buffer).
        reqs: The ``S`` requests.
        seeds: Per-row seeds.
        eos_token_ids: The model's EOS ids.
        grammars: The constrained rows' matchers (None: no constraints possible).
        pending: Other arrays to evaluate with the tokens (the KV pools).

    Returns:
        The sampled tokens and the asked-for log-probabilities.
    """
    raw = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    parts.clear()
    lp_rows = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs]
    first = [i for i, r in enumerate(reqs) if r.choice_first_tokens and not r.output_token_ids]
    constrained = None
    if grammars is not None and any(r.sampling_params.structured is not None for r in reqs):
        mx.async_eval(raw, *pending)  # the forward pass runs while the masks fill
        constrained = grammars.fill(reqs, raw.shape[-1])
        mx.synchronize()  # the finished async evaluation lets go of the raw logits
    if constrained is not None:
        rows, bitmask = constrained
        ban_in_bitmask(bitmask, early_stop_bans(reqs, eos_token_ids, raw.shape[-1]))
        logits = apply_bitmask(raw, bitmask)
    else:  # the scatter writes into a copy when the raw logits are read below
        logits = mask_early_stops(raw + 0 if lp_rows or first else raw, reqs, eos_token_ids)
    if not (lp_rows or first):
        raw = None  # the mask's output may take over the raw logits' buffer
    toks = sample(logits, [r.sampling_params for r in reqs], seeds,
                  [r.num_output_tokens for r in reqs])
    mx.eval(toks, *pending)
    tokens = toks.tolist()
    if constrained is not None:
        grammars.advance([reqs[i] for i in rows], [tokens[i] for i in rows])
    firsts = {i: gather_logprobs(raw[i], list(reqs[i].choice_first_tokens)) for i in first}
    return Sampled(tokens, token_logprobs(raw, lp_rows, toks, reqs), firsts)
