"""The calibration maps of label log-probabilities, and their fits (float64, numpy + scipy).

A question's scores are its labels' log-probabilities ``l`` (``[N, K]``: each label's total
teacher-forced log-probability after the question, as a choice row's ``choice_logprobs``).
Calibrated probabilities: ``softmax((l - b) / T)``

* ``T`` > 0, a temperature (Guo et al. 2017, "On Calibration of Modern Neural Networks"):
  one scalar per question, fitted to minimise the log loss of the gold labels on the fitting
  rows. Dividing by ``T`` keeps the order of a row's scores, so the argmax never changes;
* ``b`` ``[K]``, contextual calibration's bias (Zhao et al. 2021, "Calibrate Before Use"):
  ``b = log(mean over content-free inputs of softmax(l_cf))``, the label distribution the
  prompt alone gives a document with no content ("N/A", "", "[MASK]"). Subtracting it divides
  each label's probability by that prior before renormalising (the paper's
  ``W = diag(p_cf)^-1`` with the result renormalised rather than put through a second
  softmax), so it can change the argmax; the temperature is fitted after it.

With ``b = 0`` and ``T = 1`` the result is ``softmax(l)``, a choice row's ``choice_probs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Content-free documents of contextual calibration (Zhao et al. 2021, section 5).
CONTENT_FREE = ("N/A", "", "[MASK]")
# The temperature's search interval. A fit set answered all right drives T to 0 (every answer
# certain); a few rows can give T = 0.04 and probability 1.0 on a wrong label. A calibration
# sharpens a model's label scores at most fourfold and flattens them at most twentyfold.
TEMPERATURE_BOUNDS = (0.25, 20.0)


def _scores(logprobs: Any) -> np.ndarray:
    x = np.asarray(logprobs, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] < 2:
        raise ValueError(f"label log-probabilities [..., K >= 2] expected, got shape {x.shape}")
    if np.isnan(x).any() or (x == np.inf).any() or (x == -np.inf).all(axis=-1).any():
        raise ValueError("label log-probabilities must be finite or -inf (a label the model "
                         "cannot write), with a finite one in each row")
    return x


def log_softmax(x: np.ndarray) -> np.ndarray:
    """``log(softmax(x))`` over the last axis, stably (float64)."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def calibrated_probs(logprobs: Any, temperature: float = 1.0, bias: Any = None) -> np.ndarray:
    """``softmax((logprobs - bias) / temperature)`` over the last axis.

    Args:
        logprobs: ``[..., K]`` label log-probabilities (finite, or -inf for a label the
            model cannot write; one finite per row).
        temperature: ``T > 0``.
        bias: ``[K]`` contextual calibration's bias, or None (0).

    Returns:
        ``[..., K]`` float64 probabilities summing to 1 over the labels.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = _scores(logprobs) - (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
    return np.exp(log_softmax(z / temperature))


def content_free_bias(logprobs: Any) -> np.ndarray:
    """Contextual calibration's bias ``[K]``: the log of the mean label distribution of the
    content-free inputs' scores ``[M, K]``."""
    x = _scores(logprobs).reshape(-1, np.shape(logprobs)[-1])
    return np.log(np.exp(log_softmax(x)).mean(axis=0))


def mean_log_loss(logprobs: Any, gold: Any, temperature: float, bias: Any = None) -> float:
    """The log loss ``mean(-log q[i, gold[i]])`` of the calibrated probabilities ``q``."""
    z = _scores(logprobs) - (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
    g = np.asarray(gold, dtype=np.int64)
    return float(-np.mean(log_softmax(z / temperature)[np.arange(len(g)), g]))


def fit_temperature(logprobs: Any, gold: Any, bias: Any = None) -> float:
    """The temperature minimising :func:`mean_log_loss` on ``(logprobs [N, K], gold [N])``.

    Bounded Brent search (``scipy.optimize.minimize_scalar``) over ``log T`` in
    :data:`TEMPERATURE_BOUNDS`; the loss is convex in ``1 / T``, so the minimum is unique.

    Raises:
        ValueError: No rows, or scores that are not finite.
    """
    from scipy.optimize import minimize_scalar

    z = _scores(logprobs) - (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
    g = np.asarray(gold, dtype=np.int64)
    if len(g) == 0:
        raise ValueError("no rows to fit a temperature on")
    rows = np.arange(len(g))
    if np.isneginf(z[rows, g]).any():
        raise ValueError("a gold label is scored -inf: no temperature gives it a probability")

    def loss(log_t: float) -> float:
        return float(-np.mean(log_softmax(z * np.exp(-log_t))[rows, g]))

    lo, hi = np.log(TEMPERATURE_BOUNDS)
    fit = minimize_scalar(loss, bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-10, "maxiter": 500})
    return float(np.exp(fit.x))


def split_rows(n: int, holdout: float, seed: int) -> np.ndarray:
    """``[n]`` bools, True for the held-out rows: ``round(holdout * n)`` rows (at least one
    of each part when ``n >= 2``) drawn by ``numpy.random.default_rng(seed)``'s permutation,
    the same for every question."""
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must lie in (0, 1), got {holdout}")
    size = min(max(round(holdout * n), 1), n - 1) if n >= 2 else 0
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng(seed).permutation(n)[:size]] = True
    return held
