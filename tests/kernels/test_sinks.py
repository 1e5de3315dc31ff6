"""Attention sinks (gpt-oss: a per-head sink logit in each softmax denominator) in the paged
reference and the CPU kernel, against a float64 numpy computation of
``softmax([scores, sink])[:-1] @ V``."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import PagedKV, cpu_paged_attention, reference

BS, KVH, G, D, DV = 4, 2, 2, 8, 6  # V narrower than K: per-layer geometry too


def numpy_oracle(q, k, v, sinks, starts, lens, scale):
    """q [B, H, L, D]; k [B, KVH, S, D]; v [B, KVH, S, DV]; float64."""
    b, h, length, _ = q.shape
    out = np.zeros((b, h, length, v.shape[-1]))
    for r in range(b):
        for head in range(h):
            kv = head // G
            for i in range(length):
                pos = starts[r] + i
                n = min(pos + 1, lens[r])
                s = q[r, head, i] @ k[r, kv, :n].T * scale
                e = np.exp(np.append(s, sinks[head]) - max(s.max(), sinks[head]))
                out[r, head, i] = (e[:-1] / e.sum()) @ v[r, kv, :n]
    return out


@pytest.mark.parametrize("numpy_min_keys", [0, 1 << 30])
@pytest.mark.parametrize("kernel", [reference, cpu_paged_attention])
@pytest.mark.parametrize("length", [1, 5])
def test_sinks_match_float64(kernel, length, numpy_min_keys, monkeypatch):
    monkeypatch.setattr(cpu_paged_attention, "NUMPY_MIN_KEYS", numpy_min_keys)
    rng = np.random.default_rng(0)
    lens = np.array([7, 11], np.int32)           # tokens after this step
    starts = lens - length
    nb = -(-int(lens.max()) // BS)
    tables = np.array([[1 + i * nb + j for j in range(nb)] for i in range(2)], np.int32)
    k = rng.standard_normal((2, KVH, nb * BS, D))
    v = rng.standard_normal((2, KVH, nb * BS, DV))
    kpool = np.zeros((1 + 2 * nb, KVH, BS, D))
    vpool = np.zeros((1 + 2 * nb, KVH, BS, DV))
    for r in range(2):
        for j in range(nb):
            kpool[tables[r, j]] = k[r, :, j * BS:(j + 1) * BS]
            vpool[tables[r, j]] = v[r, :, j * BS:(j + 1) * BS]
    q = rng.standard_normal((2, KVH * G, length, D))
    sinks = rng.standard_normal(KVH * G) * 2
    f32 = lambda a: mx.array(a.astype(np.float32))  # noqa: E731
    kv = PagedKV(f32(kpool), f32(vpool), mx.array(tables), mx.array(lens), mx.array(starts),
                 D ** -0.5)
    out = kernel.paged_attention(f32(q), kv._replace(sinks=f32(sinks)))
    want = numpy_oracle(q, k, v, sinks, starts, lens, D ** -0.5)
    np.testing.assert_allclose(np.array(out), want, atol=2e-5)
    no_sink = kernel.paged_attention(f32(q), kv)
    assert np.abs(np.array(no_sink) - want).max() > 1e-2  # the sink term matters here
