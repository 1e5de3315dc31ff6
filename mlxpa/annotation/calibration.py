"""A calibration of a question set: fitted per question on labelled rows, applied to scores.

:func:`calibrate` splits the labelled rows once (:func:`~mlxpa.annotation.temperature.
split_rows`, a seed), fits each question's temperature on the fitting rows (after
contextual calibration's bias when content-free scores are given) and reports the quality
figures (:func:`~mlxpa.annotation.metrics.quality`) of the held-out rows before (the raw
``softmax`` of the label log-probabilities) and after. The file written from it is described
in :mod:`mlxpa.annotation.calibration_file`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlxpa.annotation.metrics import quality
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.temperature import (
    CONTENT_FREE,
    TEMPERATURE_BOUNDS,
    calibrated_probs,
    content_free_bias,
    fit_temperature,
    split_rows,
)


@dataclass(frozen=True, slots=True)
class QuestionCalibration:
    """One question's calibration map and how it was fitted.

    Attributes:
        labels: The question's labels, in the order of ``bias`` and of the scores it takes.
        temperature: ``T > 0``.
        bias: Contextual calibration's per-label bias, or None.
        num_fit: Labelled rows the temperature was fitted on.
        num_heldout: Labelled rows the figures were measured on.
        before: :func:`~mlxpa.annotation.metrics.quality` of the held-out rows' raw
            probabilities (None when not measured).
        after: The same with this calibration applied.
    """

    labels: tuple[str, ...]
    temperature: float
    bias: tuple[float, ...] | None = None
    num_fit: int = 0
    num_heldout: int = 0
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None

    def probs(self, logprobs: Any) -> np.ndarray:
        """Calibrated probabilities ``[..., K]`` of label log-probabilities ``[..., K]``."""
        return calibrated_probs(logprobs, self.temperature, self.bias)


# Fewer fitting rows than this make a calibration doubtful: a temperature fitted on a few rows
# (all answered right, the loss falls as T falls) makes every answer nearly certain.
FEW_ROWS = 30


def doubt(q: QuestionCalibration) -> str | None:
    """Why a question's calibration is not to be trusted (fitted on fewer than
    :data:`FEW_ROWS` rows, or its temperature at an end of its range), else None; a
    temperature set by hand (no fitting rows recorded) is the user's."""
    lo, hi = TEMPERATURE_BOUNDS
    if 0 < q.num_fit < FEW_ROWS:
        return f"fitted on {q.num_fit} row{'s' * (q.num_fit != 1)} (fewer than {FEW_ROWS})"
    if not lo * 1.05 < q.temperature < hi / 1.05:
        return f"T = {q.temperature:.3g}, at the end of its range {lo:g}..{hi:g}"
    return None


@dataclass(frozen=True, slots=True)
class Calibration:
    """The calibrations of a question set's questions (by name) and the fit's settings.

    Attributes:
        questions: Question name to its calibration (a question absent here is uncalibrated).
        seed: The split's seed.
        holdout: The held-out share of the labelled rows.
        error_budget: The budget of the figures' accepted share.
        content_free: The content-free documents the biases were measured on, or None.
        model: The model the scores came from (informational), or None.
    """

    questions: dict[str, QuestionCalibration] = field(default_factory=dict)
    seed: int = 0
    holdout: float = 0.5
    error_budget: float = 0.05
    content_free: tuple[str, ...] | None = None
    model: str | None = None


def apply_calibration(calibration: QuestionCalibration | None, logprobs: Any) -> np.ndarray:
    """``softmax((logprobs - bias) / T)`` with the question's calibration, or the raw
    ``softmax(logprobs)`` when it has none; ``[..., K]`` float64."""
    if calibration is None:
        return calibrated_probs(logprobs)
    return calibration.probs(logprobs)


def calibrate_question(question: Question, logprobs: Any, gold: Any, held: Any, *,
                       content_free_logprobs: Any = None,
                       budget: float = 0.05) -> QuestionCalibration:
    """Fit one question's calibration.

    Args:
        question: The question (its labels, and ``scale`` for the quadratic kappa).
        logprobs: ``[N, K]`` its label log-probabilities on the labelled rows.
        gold: ``[N]`` gold label indices, -1 where a row has none (left out).
        held: ``[N]`` bools, True for held-out rows (:func:`split_rows`).
        content_free_logprobs: ``[M, K]`` its scores on content-free documents, or None (no
            bias).
        budget: The error budget of the figures.

    Raises:
        ValueError: No labelled row to fit on.
    """
    x = np.asarray(logprobs, dtype=np.float64)
    g, h = np.asarray(gold, dtype=np.int64), np.asarray(held, dtype=bool)
    if x.shape != (len(g), len(question.labels)) or h.shape != g.shape:
        raise ValueError(f"question {question.name!r}: scores [N, {len(question.labels)}], "
                         f"gold [N] and held [N] expected, got {x.shape}, {g.shape}, {h.shape}")
    labelled = g >= 0
    fit_rows, test_rows = labelled & ~h, labelled & h
    if not fit_rows.any():
        raise ValueError(f"question {question.name!r}: no labelled row to fit on")
    bias = None if content_free_logprobs is None else content_free_bias(content_free_logprobs)
    temperature = fit_temperature(x[fit_rows], g[fit_rows], bias)
    ordinal = question.type == "scale"
    before = quality(g[test_rows], calibrated_probs(x[test_rows]), budget=budget,
                     ordinal=ordinal)
    after = quality(g[test_rows], calibrated_probs(x[test_rows], temperature, bias),
                    budget=budget, ordinal=ordinal)
    return QuestionCalibration(question.labels, temperature,
                               None if bias is None else tuple(bias.tolist()),
                               int(fit_rows.sum()), int(test_rows.sum()), before, after)


def calibrate(questions: QuestionSet, logprobs: Mapping[str, Any], gold: Mapping[str, Any], *,
              content_free_logprobs: Mapping[str, Any] | None = None, seed: int = 0,
              holdout: float = 0.5, budget: float = 0.05, model: str | None = None,
              content_free: tuple[str, ...] = CONTENT_FREE) -> Calibration:
    """Fit every question of ``questions`` that ``logprobs`` scores.

    Args:
        questions: The question set.
        logprobs: Question name to ``[N, K]`` label log-probabilities of the ``N``
            labelled rows (the same rows, in the same order, for every question).
        gold: Question name to ``[N]`` gold label indices (-1: none).
        content_free_logprobs: Question name to ``[M, K]`` scores of the content-free
            documents, or None (temperature only).
        seed: The split's seed (one split of the rows for every question).
        holdout: The held-out share.
        budget: The error budget of the figures.
        model: Recorded in the calibration.
        content_free: The content-free documents scored, recorded with the biases.
    """
    fitted: dict[str, QuestionCalibration] = {}
    held = None
    for q in questions.questions:
        if q.name not in logprobs:
            continue
        x = np.asarray(logprobs[q.name], dtype=np.float64)
        if held is None:
            held = split_rows(len(x), holdout, seed)
        cf = None if content_free_logprobs is None else content_free_logprobs.get(q.name)
        fitted[q.name] = calibrate_question(q, x, gold[q.name], held,
                                            content_free_logprobs=cf, budget=budget)
    return Calibration(fitted, seed, holdout, budget,
                       tuple(content_free) if content_free_logprobs is not None else None, model)
