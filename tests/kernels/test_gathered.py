"""Attention over K/V a layer derived from its gathered context (latent attention, MLA: the
RoPE scores arrive as an additive score term), against a float64 numpy computation of
``softmax(q k^T * scale + bias)[visible] @ V`` per row, head and query."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels.reference import gathered_attention

H, KVH, D, DV, S = 4, 1, 8, 6, 12  # one latent head shared by all query heads (MLA)


def numpy_oracle(q, k, v, bias, starts, lens, scale, window):
    b, h, length, _ = q.shape
    out = np.zeros((b, h, length, v.shape[-1]))
    for r in range(b):
        for head in range(h):
            for i in range(length):
                pos = starts[r] + i
                lo = 0 if window is None else max(pos - window + 1, 0)
                hi = min(pos + 1, lens[r])
                s = q[r, head, i] @ k[r, 0, lo:hi].T * scale + bias[r, head, i, lo:hi]
                e = np.exp(s - s.max())
                out[r, head, i] = (e / e.sum()) @ v[r, 0, lo:hi]
    return out


@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("window", [None, 4])
def test_gathered_attention_matches_float64(length, window):
    rng = np.random.default_rng(1)
    lens = np.array([7, 12], np.int32)
    starts = lens - length
    q = rng.standard_normal((2, H, length, D))
    k = rng.standard_normal((2, KVH, S, D))
    v = rng.standard_normal((2, KVH, S, DV))
    bias = rng.standard_normal((2, H, length, S))
    got = gathered_attention(
        mx.array(q, mx.float32), mx.array(k, mx.float32), mx.array(v, mx.float32),
        mx.array(lens), mx.array(starts), scale=0.3, sliding_window=window,
        score_bias=mx.array(bias, mx.float32))
    want = numpy_oracle(q, k, v, bias, starts, lens, 0.3, window)
    np.testing.assert_allclose(np.array(got), want, atol=1e-5, rtol=1e-5)


def test_no_bias_is_plain_masked_attention():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((1, H, 3, D), (1, KVH, S, D), (1, KVH, S, DV)))
    got = gathered_attention(mx.array(q, mx.float32), mx.array(k, mx.float32),
                             mx.array(v, mx.float32), mx.array([9]), mx.array([6]),
                             scale=0.5)
    want = numpy_oracle(q, k, v, np.zeros((1, H, 3, S)), [6], [9], 0.5, None)
    np.testing.assert_allclose(np.array(got), want, atol=1e-5, rtol=1e-5)
