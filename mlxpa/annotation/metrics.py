"""Quality figures of one question's answers against gold labels, in numpy (float64).

Inputs everywhere: ``gold`` ``[N]`` ints in ``[0, K)`` (label indices), ``probs`` ``[N, K]``
each row a distribution over the question's ``K`` labels; the prediction is a row's argmax
(the first label on a tie). Definitions, each the one scikit-learn uses where it has one (the
tests compare with it):

* accuracy; macro-F1 over the labels present in gold or predictions (``f1_score(average=
  "macro")``, a label without predictions scores 0);
* log loss, ``mean(-log p[gold])`` with ``p`` clipped to ``[eps, 1 - eps]`` (``log_loss``);
* Brier score, multi-class (Brier 1950): ``mean(sum_k (p_k - [k == gold])^2)``, in ``[0, 2]``
  (``brier_score_loss`` on the ``[N, K]`` probabilities with ``scale_by_half=False``; twice
  the binary Brier score for two labels);
* expected calibration error (Guo et al. 2017): the top label's confidence in ``n_bins``
  equal-width bins ``((b-1)/M, b/M]``, ``sum_b |B_b|/N * |accuracy(B_b) - confidence(B_b)|``;
* Cohen's kappa, unweighted or quadratic-weighted (``cohen_kappa_score``), and the confusion
  matrix (rows gold, columns predicted; ``confusion_matrix``);
* the error budget: the largest set of rows, taken by descending confidence, whose error rate
  is at most the budget, with rows of equal confidence taken together (a threshold cannot
  part them); its share of the rows and the lowest confidence in it (accept rows whose
  confidence is at least that threshold).
"""

from __future__ import annotations

from typing import Any

import numpy as np

ECE_BINS = 15
_EPS = float(np.finfo(np.float64).eps)


def _arrays(gold: Any, probs: Any) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(gold, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or g.shape != (p.shape[0],):
        raise ValueError(f"gold [N] and probs [N, K] expected, got {g.shape} and {p.shape}")
    if g.size and (g.min() < 0 or g.max() >= p.shape[1]):
        raise ValueError(f"gold indices must lie in [0, {p.shape[1]})")
    return g, p


def predictions(probs: Any) -> np.ndarray:
    """``[N]`` each row's argmax (the first label on a tie)."""
    return np.asarray(probs, dtype=np.float64).argmax(axis=1)


def accuracy(gold: Any, pred: Any) -> float:
    """Share of rows whose prediction is the gold label."""
    return float(np.mean(np.asarray(gold) == np.asarray(pred)))


def confusion_matrix(gold: Any, pred: Any, num_labels: int) -> np.ndarray:
    """``[K, K]`` int64 counts, row = gold label, column = predicted label."""
    out = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(out, (np.asarray(gold, dtype=np.int64), np.asarray(pred, dtype=np.int64)), 1)
    return out


def macro_f1(gold: Any, pred: Any, num_labels: int) -> float:
    """Mean F1 over the labels that occur in ``gold`` or ``pred`` (0 for a label with no
    true positive)."""
    cm = confusion_matrix(gold, pred, num_labels)
    tp = np.diag(cm).astype(np.float64)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    present = (support + predicted) > 0
    f1 = np.divide(2 * tp, support + predicted, out=np.zeros(num_labels), where=present)
    return float(f1[present].mean())


def log_loss(gold: Any, probs: Any) -> float:
    """``mean(-log p[i, gold[i]])``, probabilities clipped to ``[eps, 1 - eps]`` (float64)."""
    g, p = _arrays(gold, probs)
    picked = np.clip(p[np.arange(len(g)), g], _EPS, 1 - _EPS)
    return float(-np.mean(np.log(picked)))


def brier_score(gold: Any, probs: Any) -> float:
    """Multi-class Brier score: ``mean over rows of sum_k (p_k - [k == gold])^2``."""
    g, p = _arrays(gold, probs)
    onehot = np.eye(p.shape[1])[g]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def reliability_bins(gold: Any, probs: Any, n_bins: int = ECE_BINS
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per confidence bin ``((b-1)/M, b/M]``: ``(count, accuracy, mean confidence)``, each
    ``[M]`` (accuracy and confidence 0 where a bin is empty)."""
    g, p = _arrays(gold, probs)
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == g).astype(np.float64)
    bins = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(bins, minlength=n_bins)
    safe = np.maximum(count, 1)
    acc = np.bincount(bins, weights=correct, minlength=n_bins) / safe
    mean_conf = np.bincount(bins, weights=conf, minlength=n_bins) / safe
    return count, acc, mean_conf


def expected_calibration_error(gold: Any, probs: Any, n_bins: int = ECE_BINS) -> float:
    """Guo et al. (2017): ``sum_b |B_b|/N * |acc(B_b) - conf(B_b)|`` over ``n_bins``
    equal-width bins of the top label's confidence."""
    count, acc, conf = reliability_bins(gold, probs, n_bins)
    return float(np.sum(count * np.abs(acc - conf)) / max(count.sum(), 1))


def cohen_kappa(gold: Any, pred: Any, num_labels: int, weights: str | None = None) -> float:
    """Cohen's kappa of predictions against gold; ``weights="quadratic"`` (or ``"linear"``)
    for ordinal labels, penalising a disagreement by its distance. NaN when chance agreement
    is total (one label everywhere)."""
    cm = confusion_matrix(gold, pred, num_labels).astype(np.float64)
    expected = np.outer(cm.sum(axis=1), cm.sum(axis=0)) / cm.sum()
    i, j = np.indices(cm.shape)
    if weights is None:
        w = (i != j).astype(np.float64)
    elif weights in ("linear", "quadratic"):
        w = np.abs(i - j).astype(np.float64) ** (2 if weights == "quadratic" else 1)
    else:
        raise ValueError(f"weights must be None, 'linear' or 'quadratic', got {weights!r}")
    denom = np.sum(w * expected)
    return float(1 - np.sum(w * cm) / denom) if denom > 0 else float("nan")


def error_budget(gold: Any, probs: Any, budget: float) -> tuple[float, float | None]:
    """``(share, threshold)``: the share of rows accepted at an error budget and the lowest
    confidence accepted (None when no row can be).

    Rows are taken by descending top-label confidence, rows of equal confidence together;
    the set kept is the largest such prefix whose error rate is at most ``budget``.
    """
    g, p = _arrays(gold, probs)
    if not 0 <= budget <= 1:
        raise ValueError(f"error budget must lie in [0, 1], got {budget}")
    if len(g) == 0:
        return 0.0, None
    conf = p.max(axis=1)
    order = np.argsort(-conf, kind="stable")
    wrong = np.cumsum(p.argmax(axis=1)[order] != g[order])
    size = np.arange(1, len(g) + 1)
    sorted_conf = conf[order]
    ends = np.append(sorted_conf[1:] < sorted_conf[:-1], True)  # last row of each tie group
    ok = ends & (wrong <= budget * size + 1e-12)
    if not ok.any():
        return 0.0, None
    k = int(np.nonzero(ok)[0][-1])
    return (k + 1) / len(g), float(sorted_conf[k])


def quality(gold: Any, probs: Any, *, budget: float = 0.05, ordinal: bool = False,
            n_bins: int = ECE_BINS) -> dict[str, Any]:
    """Every figure of this module for one question, as the metrics JSON holds them.

    Returns:
        ``n``, ``accuracy``, ``macro_f1``, ``log_loss``, ``brier``, ``ece``,
        ``mean_confidence``, ``kappa`` (and ``kappa_quadratic`` when ``ordinal``),
        ``error_budget``, ``accepted_share``, ``threshold``, ``confusion_matrix``
        (``[K][K]``, rows gold) and ``reliability`` (:func:`reliability_bins` as lists:
        ``count``, ``accuracy``, ``confidence``); the scores are None for no rows.
    """
    g, p = _arrays(gold, probs)
    k = p.shape[1]
    out: dict[str, Any] = {"n": int(len(g)), "error_budget": budget}
    if len(g) == 0:
        keys = ("accuracy", "macro_f1", "log_loss", "brier", "ece", "mean_confidence",
                "kappa", "accepted_share", "threshold")
        return {**out, **dict.fromkeys(keys), "confusion_matrix": [[0] * k for _ in range(k)],
                "reliability": None}
    pred = p.argmax(axis=1)
    share, threshold = error_budget(g, p, budget)
    out.update(accuracy=accuracy(g, pred), macro_f1=macro_f1(g, pred, k),
               log_loss=log_loss(g, p), brier=brier_score(g, p),
               ece=expected_calibration_error(g, p, n_bins),
               mean_confidence=float(p.max(axis=1).mean()),
               kappa=_finite_or_none(cohen_kappa(g, pred, k)))
    if ordinal:
        out["kappa_quadratic"] = _finite_or_none(cohen_kappa(g, pred, k, "quadratic"))
    count, acc, conf = reliability_bins(g, p, n_bins)
    out.update(accepted_share=share, threshold=threshold,
               confusion_matrix=confusion_matrix(g, pred, k).tolist(),
               reliability={"count": count.tolist(), "accuracy": acc.tolist(),
                            "confidence": conf.tolist()})
    return out


def _finite_or_none(x: float) -> float | None:
    return x if np.isfinite(x) else None


def changed_answers(first: Any, second: Any) -> tuple[float, list[int]]:
    """The label order check: ``(share, rows)`` of the rows whose answer (label index ``[N]``)
    differs between two scorings of a question (its labels listed in two orders)."""
    a, b = np.asarray(first), np.asarray(second)
    if a.shape != b.shape:
        raise ValueError(f"two [N] answer arrays expected, got {a.shape} and {b.shape}")
    rows = np.nonzero(a != b)[0].tolist()
    return (len(rows) / len(a) if len(a) else 0.0), rows
