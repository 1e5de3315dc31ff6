"""The speculation gate: the cost fit against numpy's least squares, the acceptance estimate
by hand, and the chosen k against a brute-force search of the same objective."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.spec_decode.gate import MIN_GAIN, PRIOR_RATIO, SpecGate, StepCost


def test_cost_ratio_is_the_least_squares_fit():
    rng = np.random.default_rng(0)
    cost = StepCost()
    xs = rng.integers(1, 64, 200)
    ts = 0.24 + 0.011 * xs + rng.normal(0, 0.002, 200)
    for x, t in zip(xs, ts):
        cost.observe(int(x), float(t))
    b, a = np.polyfit(xs[-256:], ts[-256:], 1)
    assert cost.ratio == pytest.approx(a / b, rel=1e-9)
    assert cost.ratio == pytest.approx(0.24 / 0.011, rel=0.1)


def test_cost_keeps_the_prior_without_spread_or_with_a_senseless_fit():
    cost = StepCost()
    for _ in range(50):
        cost.observe(16, 0.3)
    assert cost.ratio == PRIOR_RATIO  # one size: no slope to fit
    for x in range(1, 40):
        cost.observe(x, 1.0 - 0.01 * x)  # slower with fewer tokens: not a cost model
    assert cost.ratio == PRIOR_RATIO


def test_cost_keeps_the_prior_over_close_noisy_sizes():
    """A 128-row batch decodes at 118-128 tokens a step: with 5 % timing noise, a fit there
    once gave r in the hundreds (so the gate drafted at 128 rows); over sizes 1-128 with the
    same noise the fit finds the true r = 21."""
    rng = np.random.default_rng(1)
    for _trial in range(50):
        close, wide = StepCost(), StepCost()
        for _ in range(60):
            for cost, (lo, hi) in ((close, (118, 129)), (wide, (1, 129))):
                x = int(rng.integers(lo, hi))
                cost.observe(x, 0.0034 * (21 + x) * (1 + rng.normal(0, 0.05)))
        assert close.ratio == PRIOR_RATIO
        assert wide.ratio == pytest.approx(21, rel=0.5)


def test_acceptance_by_hand():
    gate = SpecGate(4)
    assert gate.acceptance(1) == 0.5  # the prior, 1 accepted and 1 rejected
    gate.observe(1, 4, 4)  # all accepted: the row's and every row's rate are 1
    assert gate.acceptance(1) == pytest.approx(1.0)
    assert gate.acceptance(2) == pytest.approx(1.0)  # a new row starts at the batch's rate
    gate.observe(1, 4, 1)  # one, then a rejection
    acc, rej = 4 * 0.8 + 1, 0 * 0.8 + 1
    rate = (4 * 0.98 + 1) / (4 * 0.98 + 1 + 1)
    assert gate.acceptance(1) == pytest.approx((acc + 2 * rate) / (acc + rej + 2))
    gate.forget(1)
    assert gate.acceptance(1) == pytest.approx(rate)


def brute(gate: SpecGate, rows) -> int:
    r, b = gate.cost.ratio, len(rows)
    best_k, best = 0, b / (r + b)
    for k in range(1, gate.max_k + 1):
        tokens = sum(1 + sum(gate.acceptance(key) ** j for j in range(1, min(k, d) + 1))
                     for key, d in rows)
        rate = tokens / (r + b * (k + 1))
        if rate > best * (MIN_GAIN if best_k == 0 else 1):
            best_k, best = k, rate
    return best_k


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(0, 6)),
                min_size=1, max_size=40),
       st.integers(1, 8))
def test_chosen_k_maximises_tokens_per_cost(rows, k):
    gate = SpecGate(k)
    for key, drafted, accepted in rows:
        gate.observe(key, drafted, min(accepted, drafted))
    batch = [(key, d) for key, d, _ in rows]
    assert gate.num_drafts(batch) == (brute(gate, batch) if any(d for _, d in batch) else 0)


def test_small_batches_speculate_and_large_ones_do_not():
    gate = SpecGate(4)
    for key in range(128):
        for _ in range(5):
            gate.observe(key, 4, 3)  # p about 0.7
    assert gate.num_drafts([(0, 4)]) >= 3
    assert 1 <= gate.num_drafts([(key, 4) for key in range(8)]) <= 2
    assert gate.num_drafts([(key, 4) for key in range(128)]) == 0
    assert SpecGate(4, disable_by_batch_size=2).num_drafts([(0, 4), (1, 4), (2, 4)]) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(0, 6)),
                max_size=40),
       st.integers(1, 8), st.integers(1, 160))
def test_proposing_is_worth_it_when_full_drafts_would_be(rows, k, batch):
    gate = SpecGate(k)
    for key, drafted, accepted in rows:
        gate.observe(key, drafted, min(accepted, drafted))
    keys = list(range(batch))
    assert gate.worth_proposing(keys) == (brute(gate, [(key, k) for key in keys]) > 0)


def test_other_rows_rejections_never_lower_a_new_rows_prior():
    gate = SpecGate(4)
    for key in range(10):
        gate.observe(key, 4, 0)
    assert gate.acceptance(99) == 0.5
    assert gate.acceptance(0) == pytest.approx(1 / 3)  # its own rejection counts
    assert gate.worth_proposing([99])


def test_a_fresh_gate_proposes_for_one_row_not_for_128():
    gate = SpecGate(4)
    assert gate.worth_proposing([0])
    assert not gate.worth_proposing(list(range(128)))
    assert not SpecGate(4, disable_by_batch_size=2).worth_proposing([0, 1, 2])
