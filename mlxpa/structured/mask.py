"""The grammar bitmask applied to a step's logits, and the ``min_tokens`` bans cleared in it.

The bitmask is llguidance's layout (``[S, W]`` int32, bit ``t % 32`` of word ``t // 32`` set =
token ``t`` allowed), filled by :meth:`mlxpa.structured.matchers.Grammars.fill`. It is applied
in one fused MLX pass: the bits are expanded inside the kernel, so nothing ``[S, V]``-sized is
unpacked, gathered or scattered.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import numpy as np

from mlxpa.utils import cdiv


@partial(mx.compile, shapeless=True)
def _keep_allowed(words: mx.array, logits: mx.array) -> mx.array:
    """``[S, W, 1]`` int32 words, ``[S, W, 32]`` logits: the logit where its bit is set, else
    ``-inf`` (one fused pass)."""
    bits = (words >> mx.arange(32, dtype=mx.int32)) & 1
    return mx.where(bits.astype(mx.bool_), logits, -mx.inf)


def apply_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """Set the logits of disallowed tokens to ``-inf``, in one fused MLX pass over all rows.
    The result may take over ``logits``' buffer when nothing else holds it.

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
    w = cdiv(v, 32)
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
