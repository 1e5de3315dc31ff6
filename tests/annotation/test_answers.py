"""A row's ``answers`` object: raw, calibrated, read back from its scored questions (the
label order check's second order among them). Hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlxpa.annotation.answers import (
    answer,
    answers,
    outside_mass,
    row_answers,
    scored_questions,
)
from mlxpa.annotation.calibration import Calibration, QuestionCalibration
from mlxpa.annotation.questions import Question, QuestionSet

TOPIC = Question("topic", "choice", ("a", "b", "c"), "Which?")
STARS = Question("stars", "scale", ("1", "2", "3"), "How many?", values=(1.0, 2.0, 3.0))
QS = QuestionSet((TOPIC, STARS), "Pre")


def test_raw_answer():
    lp = [math.log(0.1), math.log(0.3), math.log(0.1)]
    out = answer(TOPIC, lp)
    assert out["label"] == "b" and out["calibrated"] is False
    assert out["probs"] == pytest.approx({"a": 0.2, "b": 0.6, "c": 0.2})
    assert out["logprobs"] == pytest.approx(dict(zip("abc", lp)))
    assert out["outside_prob"] == pytest.approx(0.5) and "expected" not in out
    assert answer(TOPIC, lp, 0.42)["outside_prob"] == 0.42


def test_scale_answer_has_its_expected_value():
    out = answer(STARS, np.log([0.2, 0.2, 0.6]).tolist())
    assert out["label"] == "3" and out["expected"] == pytest.approx(0.2 + 0.4 + 1.8)


def test_calibrated_answer_uses_the_calibration_and_may_change_the_label():
    lp = np.log([0.5, 0.3, 0.2]).tolist()
    cal = QuestionCalibration(TOPIC.labels, 2.0, (math.log(0.8), math.log(0.1), math.log(0.1)))
    out = answer(TOPIC, lp, calibration=cal)
    w = np.array([0.5 / 0.8, 0.3 / 0.1, 0.2 / 0.1]) ** 0.5
    assert out["calibrated"] and out["label"] == "b"
    assert list(out["probs"].values()) == pytest.approx((w / w.sum()).tolist())
    assert out["logprobs"]["a"] == pytest.approx(math.log(0.5))  # raw scores kept
    with pytest.raises(ValueError, match="not the question's"):
        answer(TOPIC, lp, calibration=QuestionCalibration(("x", "y", "z"), 1.0))
    with pytest.raises(ValueError, match="3 label scores expected, got 2"):
        answer(TOPIC, lp[:2])


def test_answers_of_a_row():
    cal = Calibration({"stars": QuestionCalibration(STARS.labels, 0.5)})
    out = answers(QS, {"topic": ([0.0, -1.0, -2.0], 0.0), "stars": ([-1.0, -2.0, -3.0], None)},
                  cal)
    assert list(out) == ["topic", "stars"]
    assert out["topic"]["calibrated"] is False and out["stars"]["calibrated"] is True
    assert out["stars"]["probs"]["1"] == pytest.approx(1 / (1 + math.exp(-2) + math.exp(-4)))


def test_outside_mass():
    assert outside_mass([math.log(0.25), math.log(0.5)]) == pytest.approx(0.25)
    assert outside_mass([0.0, 0.0]) == 0.0


LISTED = Question("tone", "choice", ("bad", "ok", "good"), template="\nTone ({labels}): ")


def test_scored_questions_add_the_second_order_where_the_text_changes():
    """The label order check asks again only a question whose template lists its labels
    (a scale's default template does; a choice's does not), listed in reverse; the labels,
    and so the answers' order, stay."""
    qs = QuestionSet((TOPIC, STARS, LISTED))
    assert scored_questions(qs) == [TOPIC, STARS, LISTED]
    asked = scored_questions(qs, permute=True)
    assert [q.name for q in asked] == ["topic", "stars", "tone", "stars", "tone"]
    assert asked[3].suffix.endswith("Scale: 3, 2, 1\nAnswer: ")
    assert asked[4].suffix == "\nTone (good, ok, bad): " and asked[4].labels == LISTED.labels


def test_row_answers_read_the_scores_in_order_and_mark_changed_answers():
    qs = QuestionSet((TOPIC, LISTED))
    first = ([math.log(0.1), math.log(0.3), math.log(0.1)], None)
    listed = (np.log([0.2, 0.5, 0.3]).tolist(), 0.1)
    flipped = (np.log([0.6, 0.3, 0.1]).tolist(), 0.2)
    out, changed = row_answers(qs, [first, listed])
    assert changed is None and list(out) == ["topic", "tone"]
    assert out["tone"]["label"] == "ok" and "permuted_label" not in out["tone"]
    out, changed = row_answers(qs, [first, listed, flipped], permute=True)
    assert changed == ["tone"] and out["tone"]["permuted_label"] == "bad"
    assert "permuted_label" not in out["topic"]  # its text is the same in any order
    out, changed = row_answers(qs, [first, listed, listed], permute=True)
    assert changed == [] and out["tone"]["permuted_label"] == "ok"
    cal = Calibration({"tone": QuestionCalibration(LISTED.labels, 1.0,
                                                   tuple(np.log([0.1, 0.8, 0.1])))})
    out, changed = row_answers(qs, [first, listed, flipped], cal, permute=True)
    # calibrated: ok loses its prior (0.5/0.8 against 0.2/0.1, 0.3/0.1), both orders alike
    assert out["tone"]["label"] == "good" and out["tone"]["permuted_label"] == "bad"
    assert changed == ["tone"]
    with pytest.raises(ValueError, match="3 scored questions expected, got 2"):
        row_answers(qs, [first, listed], permute=True)


def test_scores_are_read_by_label_whatever_their_order():
    from mlxpa.annotation.answers import answer, answers_of
    from mlxpa.annotation.questions import Question, QuestionSet
    from mlxpa.request import LabelScores

    q = Question("ok", "yes_no", ("yes", "no"))
    by_label = answer(q, {"no": -0.1, "yes": -2.3})  # the engine's dict, in another order
    assert by_label["label"] == "no"
    assert by_label == answer(q, [-2.3, -0.1])
    with pytest.raises(ValueError, match="not of its labels"):
        answer(q, {"yes": -1.0, "maybe": -2.0})
    scores = LabelScores({"no": -0.1, "yes": -2.3}, {}, 0.5)
    got = answers_of(QuestionSet((q,)), [scores])
    assert got.answers["ok"]["logprobs"] == {"yes": -2.3, "no": -0.1}
    assert got.answers["ok"]["outside_prob"] == 0.5 and got.changed is None


def test_a_choice_keeps_its_labels_as_a_tuple():
    from mlxpa.sampling_params import StructuredOutput

    labels = ("a b", "c")
    so = StructuredOutput.of_labels(labels, "questions[0].labels")
    assert so.choices is labels and so.spec == '["a b", "c"]'
    assert so == StructuredOutput.make("choice", ["a b", "c"])
    assert StructuredOutput("choice", '["x"]').choices == ("x",)
    assert StructuredOutput("regex", "a+").choices is None
