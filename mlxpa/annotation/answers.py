"""One output row's ``answers`` object: per question its label and probabilities.

For each question (in the question set's order)::

    "answers": {NAME: {"label": str, "probs": {label: float}, "logprobs": {label: float},
                       "outside_prob": float, "calibrated": bool,
                       "expected": float}}          # "expected": scale questions only

* ``logprobs``: each label's raw log-probability after the question (a choice row's
  ``choice_logprobs``), kept so that a later calibration can be fitted on outputs;
* ``probs``: over the labels, summing to 1: calibrated (``softmax((logprobs - bias) / T)``)
  when the run has a calibration for the question (``calibrated`` true), else the raw
  ``softmax(logprobs)`` (a choice row's ``choice_probs``);
* ``label``: the label of highest ``probs`` (the first on a tie): an annotation never samples;
* ``outside_prob``: the model's probability of a continuation that is none of the labels
  (raw, not calibrated; a choice row's ``choice_outside_prob``);
* ``expected``: a ``scale`` question's ``sum(probs[c] * value(c))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mlxpa.annotation.calibration import Calibration, QuestionCalibration, apply_calibration
from mlxpa.annotation.questions import Question, QuestionSet


def outside_mass(logprobs: Sequence[float]) -> float:
    """``1 - sum(exp(logprobs))`` clipped at 0: the mass outside labels none of which
    extends another's tokens (the engine's ``choice_outside_prob`` also handles those)."""
    return max(0.0, 1.0 - math.fsum(math.exp(v) for v in logprobs))


def answer(question: Question, logprobs: Sequence[float], outside_prob: float | None = None,
           calibration: QuestionCalibration | None = None) -> dict[str, Any]:
    """One question's entry of ``answers``.

    Args:
        question: The question.
        logprobs: ``[K]`` its labels' raw log-probabilities, in label order.
        outside_prob: The engine's outside mass, or None (:func:`outside_mass`).
        calibration: The question's calibration, or None.

    Raises:
        ValueError: ``logprobs`` has not one value per label, or the calibration's labels are
            not the question's.
    """
    if len(logprobs) != len(question.labels):
        raise ValueError(f"question {question.name!r}: {len(question.labels)} label scores "
                         f"expected, got {len(logprobs)}")
    if calibration is not None and calibration.labels != question.labels:
        raise ValueError(f"question {question.name!r}: the calibration's labels "
                         f"{list(calibration.labels)} are not the question's")
    probs = apply_calibration(calibration, list(logprobs)).tolist()
    best = max(range(len(probs)), key=probs.__getitem__)
    out: dict[str, Any] = {
        "label": question.labels[best],
        "probs": dict(zip(question.labels, probs)),
        "logprobs": dict(zip(question.labels, map(float, logprobs))),
        "outside_prob": outside_mass(logprobs) if outside_prob is None else outside_prob,
        "calibrated": calibration is not None,
    }
    if question.type == "scale":
        out["expected"] = math.fsum(p * v for p, v in zip(probs, question.values))
    return out


def answers(questions: QuestionSet, scores: Mapping[str, tuple[Sequence[float], float | None]],
            calibration: Calibration | None = None) -> dict[str, dict[str, Any]]:
    """A row's ``answers``: question name to :func:`answer`, for each question of
    ``questions`` in ``scores`` (name to ``(label logprobs, outside_prob)``)."""
    cals = calibration.questions if calibration is not None else {}
    return {q.name: answer(q, *scores[q.name], calibration=cals.get(q.name))
            for q in questions.questions if q.name in scores}
