"""One row's ``answers`` object (its fields: ``docs/annotation.md``): per question its
``label`` (the highest ``probs``: an annotation never samples), ``probs`` (calibrated, else
``softmax(logprobs)``), the raw ``logprobs`` (kept so a calibration can be fitted on outputs),
``outside_prob``, ``calibrated``, a scale's ``expected`` and, with the label order check,
``permuted_label``. A row's questions are scored in the order of :func:`scored_questions`;
their scores are read back in that order, each question's by its labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from mlxpa.annotation.calibration import Calibration, QuestionCalibration, apply_calibration
from mlxpa.annotation.questions import Question, QuestionSet

# A question's label log-probabilities (label to value, or values in label order) and outside
# mass.
Scores = tuple[Mapping[str, float] | Sequence[float], float | None]


class RowAnswers(NamedTuple):
    """A row's ``answers`` (question name to :func:`answer`) and, with the label order check,
    the names of the questions whose answer changed (else None)."""

    answers: dict[str, dict[str, Any]]
    changed: list[str] | None


def outside_mass(logprobs: Sequence[float]) -> float:
    """``1 - sum(exp(logprobs))`` clipped at 0: the mass outside labels none of which
    extends another's tokens (the engine's ``choice_outside_prob`` also handles those)."""
    return max(0.0, 1.0 - math.fsum(math.exp(v) for v in logprobs))


def answer(question: Question, logprobs: Mapping[str, float] | Sequence[float],
           outside_prob: float | None = None,
           calibration: QuestionCalibration | None = None) -> dict[str, Any]:
    """One question's entry of ``answers``.

    Args:
        question: The question.
        logprobs: Its labels' raw log-probabilities: label to value (the engine's label
            scores), or ``[K]`` in label order.
        outside_prob: The engine's outside mass, or None (:func:`outside_mass`).
        calibration: The question's calibration, or None.

    Raises:
        ValueError: ``logprobs`` has not one value per label (a mapping: not the question's
            labels), or the calibration's labels are not the question's.
    """
    if isinstance(logprobs, Mapping):
        if set(logprobs) != set(question.labels):
            raise ValueError(f"question {question.name!r}: scores of labels "
                             f"{list(logprobs)}, not of its labels {list(question.labels)}")
        logprobs = [logprobs[c] for c in question.labels]
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


def scored_questions(questions: QuestionSet, permute: bool = False) -> list[Question]:
    """The questions a row's scoring asks, in order: the set's own, then, with ``permute``,
    each one whose labels listed in the second order change its text
    (:meth:`~mlxpa.annotation.questions.Question.relisted`; a template that does not list
    its labels reads the same in any order, and is not asked twice)."""
    out = list(questions.questions)
    if permute:
        out += [r for q in questions.questions if (r := q.relisted()).suffix != q.suffix]
    return out


def answers_of(questions: QuestionSet, label_scores: Sequence[Any],
               calibration: Calibration | None = None, permute: bool = False) -> RowAnswers:
    """:func:`row_answers` of the engine's label scores of a row's questions (each with
    ``logprobs``, label to raw log-probability, and ``outside_prob``), read by label.

    Raises:
        ValueError: As :func:`row_answers`.
    """
    return RowAnswers(*row_answers(questions, [(s.logprobs, s.outside_prob)
                                               for s in label_scores], calibration, permute))


def row_answers(questions: QuestionSet, scores: Sequence[Scores],
                calibration: Calibration | None = None,
                permute: bool = False) -> tuple[dict[str, dict[str, Any]], list[str] | None]:
    """A row's ``answers`` and, with ``permute``, the names of the questions whose answer
    changed when their labels were listed in the second order.

    Args:
        questions: The row's question set.
        scores: Per question of :func:`scored_questions` (in its order), its labels' raw
            log-probabilities (by label, or in label order) and outside mass.
        calibration: Applied to every question it calibrates (both orders alike).
        permute: The scores include the second order's (the label order check).

    Returns:
        ``(answers, changed)``: ``changed`` is None without ``permute``.

    Raises:
        ValueError: ``scores`` does not match the questions, or the calibration's labels
            for a question are not its labels.
    """
    asked = scored_questions(questions, permute)
    if len(scores) != len(asked):
        raise ValueError(f"{len(asked)} scored questions expected, got {len(scores)}")
    cals = calibration.questions if calibration is not None else {}
    out = {q.name: answer(q, *s, calibration=cals.get(q.name))
           for q, s in zip(asked, scores[:len(questions.questions)])}
    if not permute:
        return out, None
    changed = []
    for q, s in zip(asked[len(questions.questions):], scores[len(questions.questions):]):
        label = answer(q, *s, calibration=cals.get(q.name))["label"]
        out[q.name]["permuted_label"] = label
        if label != out[q.name]["label"]:
            changed.append(q.name)
    return out, changed
