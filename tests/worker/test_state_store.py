"""The per-request recurrent-state store: new rows start empty (mlx-lm's fresh-prompt path),
stored rows come back stacked in row order, a new row beside stored ones gets zeros (mlx-lm's
initial state), and a row that starts where no state was kept is an error."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.worker.state_store import RecurrentStateStore


def _run(store, keys, starts, counts, fill):
    """One step: every state array becomes ``fill + row`` (shape [B, 2, 3])."""
    caches = store.caches(keys, starts, counts)
    for c in caches.values():
        c[0] = mx.stack([mx.full((2, 3), fill + r) for r in range(len(keys))])
        c[1] = None
    store.save(keys, starts, counts, caches)
    return caches


def test_fresh_rows_are_empty_and_states_come_back_in_row_order():
    store = RecurrentStateStore([0, 2], [2, 2])
    caches = store.caches(["a", "b"], [0, 0], [4, 4])
    assert set(caches) == {0, 2} and all(c[0] is None and c[1] is None
                                         for c in caches.values())
    _run(store, ["a", "b"], [0, 0], [4, 4], 10.0)       # a -> 10, b -> 11
    back = store.caches(["b", "a"], [4, 4], [1, 1])
    np.testing.assert_array_equal(np.array(back[0][0])[:, 0, 0], [11.0, 10.0])
    assert back[2][1] is None


def test_new_row_beside_stored_rows_gets_zeros():
    store = RecurrentStateStore([0], [2])
    _run(store, ["a"], [0], [3], 5.0)
    mixed = store.caches(["a", "c"], [3, 0], [1, 1])
    np.testing.assert_array_equal(np.array(mixed[0][0])[:, 0, 0], [5.0, 0.0])


def test_position_mismatch_and_unequal_lengths_are_errors():
    store = RecurrentStateStore([0], [2])
    _run(store, ["a"], [0], [3], 1.0)
    with pytest.raises(RuntimeError, match="position 3, the step starts at 2"):
        store.caches(["a"], [2], [1])
    with pytest.raises(ValueError, match="equal lengths"):
        store.caches(["x", "y"], [0, 0], [2, 3])


def test_restart_from_zero_and_drop():
    store = RecurrentStateStore([0], [2])
    _run(store, ["a"], [0], [3], 1.0)
    assert store.caches(["a"], [0], [2])[0][0] is None   # preempted: recomputed from 0
    _run(store, ["a", "b"], [0, 0], [2, 2], 1.0)
    store.drop(["a"])
    assert store.keys() == ["b"]
