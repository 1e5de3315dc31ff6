"""RowSplitMLP: an MLP run on two row halves on two CPU streams against a float64 numpy MLP
(Gemma's tanh-GELU gate) and against the unsplit module; small inputs are not split."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxpa.kernels.cpu_streams import RowSplitMLP, cpu_streams, is_dense_mlp


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(16, 32, bias=False)
        self.up_proj = nn.Linear(16, 32, bias=False)
        self.down_proj = nn.Linear(32, 16, bias=False)
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, x: mx.array) -> mx.array:
        self.calls.append(tuple(x.shape))
        return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))


def _oracle(mlp: _MLP, x: np.ndarray) -> np.ndarray:
    w = {k: np.array(v).astype(np.float64) for k, v in
         [("g", mlp.gate_proj.weight), ("u", mlp.up_proj.weight), ("d", mlp.down_proj.weight)]}
    g = x @ w["g"].T
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return (gelu * (x @ w["u"].T)) @ w["d"].T


@pytest.mark.parametrize("shape", [(3, 7, 16), (1, 5, 16), (4, 1, 16)])
def test_row_split_matches_float64_and_unsplit(shape):
    mx.random.seed(0)
    mlp = _MLP()
    x = mx.random.normal(shape)
    split = RowSplitMLP(mlp, min_rows=2)
    got = split(x)
    rows = shape[0] * shape[1]
    assert mlp.calls == [(rows // 2, 16), (rows - rows // 2, 16)]
    assert got.shape == shape
    np.testing.assert_allclose(np.array(got), _oracle(mlp, np.array(x).astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(got), np.array(mlp(x)), rtol=1e-6, atol=1e-6)


def test_small_inputs_run_whole_and_streams_differ():
    mlp = _MLP()
    RowSplitMLP(mlp, min_rows=100)(mx.zeros((2, 3, 16)))
    assert mlp.calls == [(2, 3, 16)]
    a, b = cpu_streams()
    assert a == mx.default_stream(mx.cpu) and b != a


def test_only_dense_mlps_are_split():
    assert is_dense_mlp(_MLP())
    moe = nn.Module()
    moe.gate = nn.Linear(16, 4)
    moe.experts = _MLP()
    assert not is_dense_mlp(moe) and not is_dense_mlp(nn.Module())


def test_split_runs_in_a_thread_other_than_the_first_caller():
    """MLX streams belong to their thread: a Ray actor calls the model from another thread than
    the one that first split an MLP ("There is no Stream(cpu, 1) in current thread")."""
    import threading

    mx.random.seed(1)
    mlp = _MLP()
    x = mx.random.normal((2, 5, 16))
    split = RowSplitMLP(mlp, min_rows=2)
    first = np.array(split(x))
    got, errors = [], []

    def call():
        try:
            got.append(np.array(split(x)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert not errors, errors
    np.testing.assert_allclose(got[0], _oracle(mlp, np.array(x).astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], first)
