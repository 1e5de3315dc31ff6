"""The quality figures against scikit-learn on the same arrays, a hand-computed case and a
direct float64 loop (ECE), and a brute-force search (the error budget)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from mlxpa.annotation.metrics import (
    accuracy,
    brier_score,
    changed_answers,
    cohen_kappa,
    confusion_matrix,
    error_budget,
    expected_calibration_error,
    log_loss,
    macro_f1,
    predictions,
    quality,
    reliability_bins,
)


def _random(seed: int, n: int = 200, k: int = 4, sharp: float = 3.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * sharp
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    gold = np.array([rng.choice(k, p=p) if rng.random() < 0.7 else rng.integers(k)
                     for p in probs])
    return gold, probs


# A hand-made case: 4 rows, 3 labels; predictions 0, 1, 1, 2 against gold 0, 1, 2, 2.
HAND_GOLD = np.array([0, 1, 2, 2])
HAND_PROBS = np.array([[0.7, 0.2, 0.1],
                       [0.1, 0.6, 0.3],
                       [0.2, 0.5, 0.3],
                       [0.05, 0.05, 0.9]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_sklearn_on_random_arrays(seed):
    gold, probs = _random(seed)
    pred = predictions(probs)
    k = probs.shape[1]
    assert accuracy(gold, pred) == pytest.approx(skm.accuracy_score(gold, pred), abs=1e-12)
    assert macro_f1(gold, pred, k) == pytest.approx(
        skm.f1_score(gold, pred, average="macro", zero_division=0), abs=1e-12)
    assert log_loss(gold, probs) == pytest.approx(
        skm.log_loss(gold, probs, labels=list(range(k))), abs=1e-12)
    assert brier_score(gold, probs) == pytest.approx(
        skm.brier_score_loss(gold, probs, labels=list(range(k)), scale_by_half=False),
        abs=1e-12)
    assert cohen_kappa(gold, pred, k) == pytest.approx(skm.cohen_kappa_score(gold, pred),
                                                       abs=1e-12)
    for w in ("linear", "quadratic"):
        assert cohen_kappa(gold, pred, k, w) == pytest.approx(
            skm.cohen_kappa_score(gold, pred, weights=w), abs=1e-12)
    np.testing.assert_array_equal(confusion_matrix(gold, pred, k),
                                  skm.confusion_matrix(gold, pred, labels=list(range(k))))


def test_against_sklearn_on_the_hand_made_case():
    pred = predictions(HAND_PROBS)
    assert pred.tolist() == [0, 1, 1, 2]
    assert accuracy(HAND_GOLD, pred) == 0.75
    # F1 per label: 1, 2/3 (tp 1, support 1, predicted 2), 2/3 (tp 1, support 2, predicted 1)
    assert macro_f1(HAND_GOLD, pred, 3) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert macro_f1(HAND_GOLD, pred, 3) == pytest.approx(
        skm.f1_score(HAND_GOLD, pred, average="macro"))
    assert log_loss(HAND_GOLD, HAND_PROBS) == pytest.approx(
        -np.mean(np.log([0.7, 0.6, 0.3, 0.9])))
    # Brier: (0.09 + 0.04 + 0.01) + (0.01 + 0.16 + 0.09) + (0.04 + 0.25 + 0.49)
    #        + (0.0025 + 0.0025 + 0.01), over 4 rows
    assert brier_score(HAND_GOLD, HAND_PROBS) == pytest.approx(1.195 / 4)
    assert brier_score(HAND_GOLD, HAND_PROBS) == pytest.approx(skm.brier_score_loss(
        HAND_GOLD, HAND_PROBS, labels=[0, 1, 2], scale_by_half=False))
    # kappa: observed 0.75; expected (1*1 + 1*2 + 2*1) / 16 = 5/16
    assert cohen_kappa(HAND_GOLD, pred, 3) == pytest.approx((0.75 - 5 / 16) / (1 - 5 / 16))
    assert confusion_matrix(HAND_GOLD, pred, 3).tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]


def test_binary_brier_is_twice_sklearns_binary_definition():
    gold, probs = _random(3, k=2)
    assert brier_score(gold, probs) == pytest.approx(
        2 * skm.brier_score_loss(gold, probs[:, 1]), abs=1e-12)


def test_ece_hand_computed():
    """Confidences 0.7, 0.6, 0.5, 0.9 fall in bins (0.6667, 0.7333], (0.5333, 0.6],
    (0.4667, 0.5333], (0.8667, 0.9333] of 15: one row each, so ECE = mean |correct - conf|
    = (0.3 + 0.4 + 0.5 + 0.1) / 4 (rows 0, 1, 3 right, row 2 wrong)."""
    assert expected_calibration_error(HAND_GOLD, HAND_PROBS) == pytest.approx(1.3 / 4)
    # Two bins with two rows each: M = 2, bins (0, 0.5] and (0.5, 1]:
    # (0.5]: row 2 (0.5, wrong): |0 - 0.5|; (0.5, 1]: rows 0, 1, 3 all right, conf 2.2 / 3
    expected = (1 * 0.5 + 3 * abs(1 - 2.2 / 3)) / 4
    assert expected_calibration_error(HAND_GOLD, HAND_PROBS, n_bins=2) == pytest.approx(expected)


def _ece_loop(gold, probs, n_bins=15):
    """Guo et al.'s definition written as a plain float64 loop over bins and rows."""
    total, n = 0.0, len(gold)
    for b in range(1, n_bins + 1):
        lo, hi = (b - 1) / n_bins, b / n_bins
        rows = [i for i in range(n) if (lo < max(probs[i]) <= hi) or (b == 1 and
                                                                      max(probs[i]) == 0)]
        if not rows:
            continue
        acc = sum(int(np.argmax(probs[i]) == gold[i]) for i in rows) / len(rows)
        conf = sum(float(max(probs[i])) for i in rows) / len(rows)
        total += len(rows) / n * abs(acc - conf)
    return total


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ece_against_a_float64_loop(seed):
    gold, probs = _random(seed, n=300, k=5, sharp=1.0 + seed)
    assert expected_calibration_error(gold, probs) == pytest.approx(_ece_loop(gold, probs),
                                                                    abs=1e-12)


def test_ece_edges_of_bins():
    """A confidence on a bin edge (0.6 = 9/15) belongs to the bin it closes."""
    probs = np.array([[0.6, 0.4], [1.0, 0.0]])
    count, acc, conf = reliability_bins([0, 0], probs)
    assert count[8] == 1 and count[14] == 1 and count.sum() == 2
    assert expected_calibration_error([0, 0], probs) == pytest.approx(0.4 / 2)


def _budget_brute(gold, probs, budget):
    """Every threshold among the confidences: the largest accepted set within the budget."""
    conf, right = probs.max(1), probs.argmax(1) == gold
    best = (0.0, None)
    for t in sorted(set(conf.tolist())):
        kept = conf >= t
        if (~right[kept]).sum() <= budget * kept.sum() + 1e-12 and kept.mean() > best[0]:
            best = (kept.mean(), t)
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [0.0, 0.05, 0.2, 0.5])
def test_error_budget_against_brute_force(seed, budget):
    gold, probs = _random(seed, n=120, k=3)
    if seed % 2:  # ties: confidences rounded to 1 decimal
        probs = np.round(probs, 1)
        probs[:, 0] = 1 - probs[:, 1:].sum(1)
    share, threshold = error_budget(gold, probs, budget)
    want_share, want_t = _budget_brute(gold, probs, budget)
    assert share == pytest.approx(want_share)
    assert threshold == (None if want_t is None else pytest.approx(want_t))


def test_error_budget_hand_made():
    # by confidence: 0.9 right, 0.7 right, 0.6 right, 0.5 wrong
    assert error_budget(HAND_GOLD, HAND_PROBS, 0.0) == (0.75, 0.6)
    assert error_budget(HAND_GOLD, HAND_PROBS, 0.25) == (1.0, 0.5)
    # the most confident row wrong: nothing can be accepted at 0 errors
    assert error_budget([1], [[0.9, 0.1]], 0.0) == (0.0, None)
    # a tie keeps rows together: both at 0.8, one wrong: 1 error in 2 rows
    assert error_budget([0, 1], [[0.8, 0.2], [0.8, 0.2]], 0.4) == (0.0, None)
    assert error_budget([0, 1], [[0.8, 0.2], [0.8, 0.2]], 0.5) == (1.0, 0.8)


def test_quality_collects_every_figure():
    q = quality(HAND_GOLD, HAND_PROBS, budget=0.0, ordinal=True)
    assert q["n"] == 4 and q["accuracy"] == 0.75 and q["accepted_share"] == 0.75
    assert q["threshold"] == 0.6 and q["confusion_matrix"] == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    assert q["kappa_quadratic"] == pytest.approx(
        skm.cohen_kappa_score(HAND_GOLD, [0, 1, 1, 2], weights="quadratic"))
    assert sum(q["reliability"]["count"]) == 4 and len(q["reliability"]["count"]) == 15
    assert q["ece"] == pytest.approx(1.3 / 4)
    empty = quality(np.zeros(0, int), np.zeros((0, 3)))
    assert empty["n"] == 0 and empty["accuracy"] is None and empty["threshold"] is None


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"gold \[N\] and probs \[N, K\]"):
        log_loss([0, 1], [[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        brier_score([2], [[0.5, 0.5]])
    with pytest.raises(ValueError, match="error budget"):
        error_budget([0], [[1.0, 0.0]], 1.5)


def test_changed_answers():
    assert changed_answers([0, 1, 2, 2], [0, 2, 2, 1]) == (0.5, [1, 3])
    assert changed_answers([], []) == (0.0, [])
    with pytest.raises(ValueError, match="two"):
        changed_answers([0], [0, 1])
