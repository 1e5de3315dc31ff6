"""mlxpa.kernels.cpu_fused against float64 numpy oracles, and its model patch on tiny models
(swapped only inside the context, restored after, same logits as mlx-lm's ops)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxpa.kernels import cpu_fused

X = np.concatenate([np.linspace(-12, 12, 20001), [0.0, 1e-6, -1e-6, 50.0, -50.0, 1e4, -1e4]])


def _np(a: mx.array) -> np.ndarray:
    return np.array(a).astype(np.float64)


def test_tanh_matches_float64():
    got = _np(cpu_fused.tanh(mx.array(X, dtype=mx.float32)))
    x32 = X.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(got, np.tanh(x32), atol=1e-6, rtol=0)
    assert got.max() <= 1.0 and got.min() >= -1.0


def test_gelu_tanh_matches_float64_formula_and_mlx():
    x32 = X.astype(np.float32).astype(np.float64)
    want = 0.5 * x32 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x32 + 0.044715 * x32 ** 3)))
    got = _np(cpu_fused.gelu_tanh(mx.array(X, dtype=mx.float32)))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-6)
    mlx_ref = _np(nn.gelu_approx(mx.array(X, dtype=mx.float32)))
    np.testing.assert_allclose(got, mlx_ref, atol=3e-6, rtol=3e-6)


def test_silu_and_swiglu_match_float64():
    x32 = X.astype(np.float32).astype(np.float64)
    silu = x32 * (0.5 + 0.5 * np.tanh(0.5 * x32))
    np.testing.assert_allclose(_np(cpu_fused.silu(mx.array(X, dtype=mx.float32))), silu,
                               atol=2e-6, rtol=2e-6)
    up = np.cos(x32)
    got = _np(cpu_fused.swiglu(mx.array(X, dtype=mx.float32), mx.array(up, dtype=mx.float32)))
    np.testing.assert_allclose(got, silu * up, atol=2e-6, rtol=2e-6)


def test_activations_per_shape_and_strides_match_float64():
    # Compiled per input shape: every new shape (rows of a step), a transposed and a sliced
    # (non-contiguous) input and a broadcast ``up`` get the float64 values.
    rng = np.random.default_rng(3)
    base = mx.array(rng.standard_normal((6, 40, 48)).astype(np.float32) * 4)
    for x in (base, base[:, :7], base[:1, :1], base.swapaxes(0, 2), base[:, ::3, 5:]):
        x64 = _np(x)
        want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
        np.testing.assert_allclose(_np(cpu_fused.gelu_tanh(x)), want, atol=2e-6, rtol=2e-6)
        up = x[..., :1] * 0.5  # broadcast along the last axis; silu error 2e-6 times up
        silu = x64 * (0.5 + 0.5 * np.tanh(0.5 * x64))
        np.testing.assert_allclose(_np(cpu_fused.swiglu(x, up)), silu * _np(up), atol=2e-5,
                                   rtol=2e-6)


def _rope_oracle(x: np.ndarray, offsets: np.ndarray, dims: int, base: float, scale: float,
                 traditional: bool) -> np.ndarray:
    """RoFormer rotation in float64, one row at a time (independent of both implementations)."""
    out = x.astype(np.float64).copy()
    half = dims // 2
    inv = base ** (-np.arange(half) / half)
    for b in range(x.shape[0]):
        pos = (offsets[b] + np.arange(x.shape[2])) * scale
        th = pos[:, None] * inv[None, :]
        c, s = np.cos(th)[None], np.sin(th)[None]
        if traditional:
            a, e = out[b, :, :, 0:dims:2].copy(), out[b, :, :, 1:dims:2].copy()
            out[b, :, :, 0:dims:2], out[b, :, :, 1:dims:2] = a * c - e * s, a * s + e * c
        else:
            a, e = out[b, :, :, :half].copy(), out[b, :, :, half:dims].copy()
            out[b, :, :, :half], out[b, :, :, half:dims] = a * c - e * s, a * s + e * c
    return out


@pytest.mark.parametrize(("dims", "traditional", "base", "scale"), [
    (32, False, 10000.0, 1.0), (32, True, 10000.0, 1.0), (16, False, 1e6, 1.0),
    (32, False, 10000.0, 0.25)])
def test_table_rope_matches_float64(dims, traditional, base, scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 5, 32)).astype(np.float32)
    offsets = np.array([0, 17, 900], np.int32)
    rope = nn.RoPE(dims, traditional=traditional, base=base, scale=scale)
    table = cpu_fused.TableRoPE(rope, {})
    got = _np(table(mx.array(x), offset=mx.array(offsets)))
    want = _rope_oracle(x, offsets, dims, base, scale, traditional)
    # float32 angles at position ~900 carry ~5e-5 rad of error in any float32 RoPE.
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)
    ref = _np(rope(mx.array(x), offset=mx.array(offsets)))
    assert np.abs(got - want).max() <= np.abs(ref - want).max() + 1e-6
    assert table(mx.array(x), offset=3).tolist() == rope(mx.array(x), offset=3).tolist()


def test_table_rope_shares_tables_across_layers():
    tables: dict = {}
    a = cpu_fused.TableRoPE(nn.RoPE(32, base=10000.0), tables)
    b = cpu_fused.TableRoPE(nn.RoPE(32, base=10000.0), tables)
    c = cpu_fused.TableRoPE(nn.RoPE(32, base=1e6), tables)
    off, x = mx.array([4, 9]), mx.zeros((2, 1, 3, 32))
    for r in (a, b, c):
        r(x, offset=off)
    assert len(tables) == 2
