"""The step's token masks against independent references.

``apply_bitmask`` (one fused MLX pass) against a per-bit Python reference of llguidance's
layout (bit ``t % 32`` of word ``t // 32`` of an int32 word set = token ``t`` allowed;
disallowed logits become -inf; columns past ``32 * W`` are disallowed) and llguidance's own
numpy helper, for vocabularies that are and are not multiples of 32, rows left unconstrained
(all bits set) and bfloat16 logits. ``ban_in_bitmask`` (``min_tokens``) against a hand-built
case, including a row it would empty."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from llguidance.numpy import apply_token_bitmask_inplace

from mlxpa.structured.mask import apply_bitmask, ban_in_bitmask


def reference(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Bit by bit, in Python integers."""
    out = logits.copy()
    for s in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            word = int(bitmask[s, t // 32]) if t // 32 < bitmask.shape[1] else 0
            if not (word >> (t % 32)) & 1:
                out[s, t] = -np.inf
    return out


@pytest.mark.parametrize("vocab", [100, 128, 257, 31])
def test_apply_bitmask_matches_reference(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(5, vocab)).astype(np.float32)
    words = -(-vocab // 32)
    bitmask = rng.integers(-2**31, 2**31 - 1, size=(5, words), dtype=np.int64).astype(np.int32)
    bitmask[0, 0] = 0b101  # tokens 0 and 2 allowed in word 0
    bitmask[2] = -1  # a row without a constraint: unchanged
    bitmask[3] = 0  # nothing allowed: all -inf
    bitmask[4, -1] = -1  # bits past the vocabulary are ignored
    out = np.array(apply_bitmask(mx.array(logits), bitmask))
    ref = reference(logits, bitmask)
    assert np.array_equal(out, ref)
    assert out[0, 0] == logits[0, 0] and out[0, 1] == -np.inf
    assert np.array_equal(out[2], logits[2]) and np.all(out[3] == -np.inf)
    lib = logits.copy()
    apply_token_bitmask_inplace(lib, bitmask)
    assert np.array_equal(out, lib)


def test_apply_bitmask_narrow_mask_bfloat16_and_shape_errors():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 70)).astype(np.float32)
    bitmask = rng.integers(-2**31, 2**31 - 1, size=(3, 2), dtype=np.int64).astype(np.int32)
    out = np.array(apply_bitmask(mx.array(logits), bitmask))  # columns 64.. not covered
    assert np.array_equal(out, reference(logits, bitmask)) and np.all(out[:, 64:] == -np.inf)
    half = mx.array(logits).astype(mx.bfloat16)
    out = apply_bitmask(half, bitmask)
    assert out.dtype == mx.bfloat16
    ref = reference(np.array(half.astype(mx.float32)), bitmask)
    assert np.array_equal(np.array(out.astype(mx.float32)), ref)
    with pytest.raises(ValueError, match="2 rows for 3 rows"):
        apply_bitmask(mx.array(logits), bitmask[:2])


def test_ban_in_bitmask_clears_bits_but_never_empties_a_row():
    vocab = 70
    bitmask = np.full((3, 3), -1, np.int32)
    bitmask[:, -1] = (1 << (vocab % 32)) - 1  # bits past the vocabulary clear
    bitmask[1] = 0
    bitmask[1, 1] = 1 << 1  # row 1 allows token 33 only (a grammar that must end)
    ban_in_bitmask(bitmask, {0: [1, 33, 69], 1: [33], 2: list(range(vocab))})
    allowed = [[t for t in range(vocab) if (int(bitmask[s, t // 32]) >> (t % 32)) & 1]
               for s in range(3)]
    assert allowed[0] == [t for t in range(vocab) if t not in (1, 33, 69)]
    assert allowed[1] == [33]  # banning its only token would leave nothing to sample
    assert allowed[2] == list(range(vocab))  # the ban covers the vocabulary: left alone
