"""The calibration map and its fits: the fitted temperature against a float64 grid search and
scipy's own minimiser on the same scores; the argmax never moves under a temperature;
contextual calibration's bias by hand; the split is deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import log_softmax as scipy_log_softmax

from mlxpa.annotation.temperature import (
    TEMPERATURE_BOUNDS,
    calibrated_probs,
    content_free_bias,
    fit_temperature,
    mean_log_loss,
    split_rows,
)


def _scores(seed: int, n: int = 400, k: int = 5, sharp: float = 4.0, noise: float = 0.6):
    """Overconfident label scores: sharp logits whose gold label is often another one."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * sharp
    gold = np.where(rng.random(n) < noise, rng.integers(k, size=n), logits.argmax(1))
    return scipy_log_softmax(logits, axis=1), gold


def _nll(logprobs, gold, t):
    return float(-np.mean(scipy_log_softmax(logprobs / t, axis=1)[np.arange(len(gold)), gold]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fitted_temperature_equals_a_float64_grid_search(seed):
    logprobs, gold = _scores(seed)
    t = fit_temperature(logprobs, gold)
    grid = np.exp(np.linspace(np.log(0.05), np.log(50), 20001))  # steps of 0.035 %
    losses = [_nll(logprobs, gold, g) for g in grid]
    best = grid[int(np.argmin(losses))]
    assert t == pytest.approx(best, rel=1e-3)
    assert mean_log_loss(logprobs, gold, t) <= min(losses) + 1e-9
    assert t > 1  # overconfident scores are softened


@pytest.mark.parametrize("seed", [0, 3])
def test_fitted_temperature_equals_scipy_minimize(seed):
    logprobs, gold = _scores(seed, noise=0.2 + 0.2 * seed)
    t = fit_temperature(logprobs, gold)
    ref = minimize(lambda x: _nll(logprobs, gold, x[0]), x0=[1.0], method="L-BFGS-B",
                   bounds=[TEMPERATURE_BOUNDS], options={"ftol": 1e-15, "gtol": 1e-12})
    assert t == pytest.approx(ref.x[0], rel=1e-4)


def test_underconfident_scores_are_sharpened():
    logprobs, gold = _scores(4, sharp=0.3, noise=0.0)
    assert fit_temperature(logprobs, gold) < 1


def test_a_fit_set_answered_all_right_stops_at_the_bound():
    logprobs, gold = _scores(5, noise=0.0)
    assert fit_temperature(logprobs, gold) == pytest.approx(TEMPERATURE_BOUNDS[0], rel=1e-3)


@pytest.mark.parametrize("t", [0.01, 0.3, 1.0, 2.7, 100.0])
def test_a_temperature_never_changes_the_argmax(t):
    logprobs, _ = _scores(6, n=2000)
    probs = calibrated_probs(logprobs, t)
    np.testing.assert_array_equal(probs.argmax(1), logprobs.argmax(1))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)


def test_the_fitted_temperature_keeps_the_argmax_and_lowers_the_loss():
    logprobs, gold = _scores(7)
    t = fit_temperature(logprobs, gold)
    np.testing.assert_array_equal(calibrated_probs(logprobs, t).argmax(1), logprobs.argmax(1))
    assert mean_log_loss(logprobs, gold, t) < mean_log_loss(logprobs, gold, 1.0)


def test_identity_map_is_the_softmax_of_the_scores():
    logprobs = np.log(np.array([[0.2, 0.3], [0.01, 0.04]]))  # not normalised: outside mass
    np.testing.assert_allclose(calibrated_probs(logprobs), [[0.4, 0.6], [0.2, 0.8]])


def test_contextual_bias_by_hand():
    # content-free distributions (0.8, 0.2) and (0.6, 0.4): mean (0.7, 0.3)
    cf = np.log(np.array([[0.8, 0.2], [0.6, 0.4]]) * 0.5)  # scale does not matter
    bias = content_free_bias(cf)
    np.testing.assert_allclose(np.exp(bias), [0.7, 0.3])
    # a row at (0.6, 0.4) divided by the prior: (0.6/0.7, 0.4/0.3) renormalised
    got = calibrated_probs(np.log([0.6, 0.4]), 1.0, bias)
    want = np.array([0.6 / 0.7, 0.4 / 0.3])
    np.testing.assert_allclose(got, want / want.sum())
    assert got.argmax() == 1  # the bias can change the argmax; a temperature cannot
    # with a temperature: ((p / prior) ** (1 / T)) renormalised
    got = calibrated_probs(np.log([0.6, 0.4]), 2.0, bias)
    np.testing.assert_allclose(got, want ** 0.5 / (want ** 0.5).sum())


def test_fit_with_a_bias_fits_the_shifted_scores():
    logprobs, gold = _scores(8)
    bias = np.linspace(-1, 1, logprobs.shape[1])
    assert fit_temperature(logprobs, gold, bias) == pytest.approx(
        fit_temperature(logprobs - bias, gold), rel=1e-9)


def test_split_is_deterministic_and_sized():
    a, b = split_rows(101, 0.3, seed=7), split_rows(101, 0.3, seed=7)
    np.testing.assert_array_equal(a, b)
    assert a.sum() == 30
    assert not np.array_equal(a, split_rows(101, 0.3, seed=8))
    assert split_rows(2, 0.01, 0).sum() == 1 and split_rows(2, 0.99, 0).sum() == 1
    with pytest.raises(ValueError, match="holdout"):
        split_rows(10, 1.0, 0)


def test_a_label_scored_minus_infinity_gets_no_probability():
    np.testing.assert_allclose(calibrated_probs([[0.0, -np.inf, 0.0]], 2.0), [[0.5, 0.0, 0.5]])
    assert fit_temperature([[0.0, -np.inf], [-1.0, 0.0]], [0, 1]) == pytest.approx(
        TEMPERATURE_BOUNDS[0], rel=1e-3)  # both right: the lowest temperature
    with pytest.raises(ValueError, match="gold label is scored -inf"):
        fit_temperature([[0.0, -np.inf]], [1])


def test_bad_scores_are_refused():
    for bad in ([[np.nan, 0.0]], [[np.inf, 0.0]], [[-np.inf, -np.inf]]):
        with pytest.raises(ValueError, match="finite or -inf"):
            calibrated_probs(bad)
    with pytest.raises(ValueError, match="K >= 2"):
        calibrated_probs([[0.0]])
    with pytest.raises(ValueError, match="temperature"):
        calibrated_probs([[0.0, 1.0]], 0.0)
    with pytest.raises(ValueError, match="no rows"):
        fit_temperature(np.zeros((0, 2)), np.zeros(0, int))
