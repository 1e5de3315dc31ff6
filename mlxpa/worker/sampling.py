"""Batched per-request sampling: greedy requests by one argmax, the others with mlx-lm's filters.

Greedy requests (temperature 0) need only an argmax over the vocabulary, so a step whose
requests are all greedy costs one ``argmax``; log-probabilities are computed only for requests
that sample. Those apply mlx-lm's ``apply_top_p`` / ``apply_min_p`` / ``apply_top_k`` (in
mlx-lm's order) and draw with ``mx.random.categorical`` under a per-request key derived from
the request's seed and its output position, so a seeded request gets the same text whatever else is
in the batch, and after preemption and recompute.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxpa.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
# The smallest top_p passed to mlx-lm's filter: it compares float32 masses with
# ``top_p * total``, and a top_p that rounds to 0 in float32 (1e-300) would drop every token
# and read past the sorted row; any top_p this small keeps only the most likely token anyway.
_MIN_TOP_P = 1e-30


def request_key(seed: int, position: int) -> mx.array:
    """PRNG key for the token at output ``position`` of a request seeded with ``seed``
    (a splitmix64 mix of both, so nearby seeds and positions give unrelated keys)."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key((z ^ (z >> 31)) & _MASK64)


def sample_one(logits: mx.array, params: SamplingParams, seed: int, position: int) -> mx.array:
    """Sample one token from ``[1, vocab]`` logits with temperature/top-p/top-k/min-p.

    Tokens the filters remove stay at ``-inf`` whatever the temperature, and every kept token's
    scaled log-probability is finite (``params.temperature >= SAMPLING_EPS``).

    Returns:
        ``[1]`` uint32 token id.
    """
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0 < params.top_p < 1.0:
        logprobs = apply_top_p(logprobs, max(params.top_p, _MIN_TOP_P))
    if params.min_p > 0:
        logprobs = apply_min_p(logprobs, params.min_p)
    if 0 < params.top_k < logits.shape[-1]:
        logprobs = apply_top_k(logprobs, params.top_k)
    # NOTE: the filters leave removed tokens at -inf; a huge temperature makes 1/T underflow
    # to 0 in float32 and -inf * 0 is NaN, so removed tokens are kept at -inf explicitly
    # (kept ones are finite: temperatures below SAMPLING_EPS never get here).
    scaled = mx.where(logprobs == -mx.inf, logprobs, logprobs * (1 / params.temperature))
    return mx.random.categorical(scaled, key=request_key(seed, position))


def sample(logits: mx.array, params: list[SamplingParams], seeds: list[int],
           positions: list[int]) -> mx.array:
    """Sample one token per request.

    Args:
        logits: ``[S, vocab]`` logits of the requests being sampled (any float dtype).
        params: Per-request sampling parameters.
        seeds: Per-request seeds (the request's seed, or one the engine derived for it).
        positions: Per-request output position of the token being sampled (0 for the first).

    Returns:
        ``[S]`` uint32 token ids (lazy; the caller evaluates).
    """
    greedy = mx.argmax(logits, axis=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return greedy
    logits = logits.astype(mx.float32)
    tokens = [greedy[i:i + 1] for i in range(len(params))]
    for i in sampled:
        tokens[i] = sample_one(logits[i:i + 1], params[i], seeds[i], positions[i]).astype(
            greedy.dtype)
    return mx.concatenate(tokens)
