"""apply_bitmask against a hand-computed reference: bit ``t % 32`` of word ``t // 32`` of
llguidance's int32 bitmask set = token ``t`` allowed; disallowed logits become -inf, rows
without a bitmask are unchanged; llguidance's own numpy helper agrees."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from llguidance.numpy import apply_token_bitmask_inplace

from mlxpa.worker.structured import apply_bitmask


def test_apply_bitmask_matches_reference():
    rng = np.random.default_rng(0)
    vocab = 100  # not a multiple of 32: the last word's high bits are ignored
    logits = rng.normal(size=(4, vocab)).astype(np.float32)
    bitmask = rng.integers(-2**31, 2**31 - 1, size=(2, 4), dtype=np.int64).astype(np.int32)
    bitmask[0, 0] = 0b101  # tokens 0 and 2 allowed in word 0
    out = np.array(apply_bitmask(mx.array(logits), [1, 3], bitmask))
    for k, row in enumerate([1, 3]):
        for t in range(vocab):
            allowed = (int(bitmask[k, t // 32]) >> (t % 32)) & 1
            assert out[row, t] == (logits[row, t] if allowed else -np.inf)
    assert np.array_equal(out[[0, 2]], logits[[0, 2]])
    assert out[1, 0] == logits[1, 0] and out[1, 1] == -np.inf
    ref = logits[[1, 3]].copy()
    apply_token_bitmask_inplace(ref, bitmask)
    assert np.array_equal(out[[1, 3]], ref)
