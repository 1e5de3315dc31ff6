"""A row's ``answers`` object, and questions as today's choice rows and back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlxpa.annotation.answers import answer, answers, outside_mass
from mlxpa.annotation.calibration import Calibration, QuestionCalibration
from mlxpa.annotation.choice_rows import answers_from_records, choice_rows, split_id
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.render import prompt_text, question_messages

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


def test_choice_rows_and_back():
    rows = choice_rows({"id": 7, "prompt": "Doc"}, QS)
    assert rows == [
        {"id": "7/topic", "prompt": prompt_text("Doc", TOPIC, "Pre"),
         "structured_outputs": {"choice": ["a", "b", "c"]}},
        {"id": "7/stars", "prompt": prompt_text("Doc", STARS, "Pre"),
         "structured_outputs": {"choice": ["1", "2", "3"]}}]
    chat = choice_rows({"messages": [{"role": "user", "content": "Doc"}]}, QS, index=3)
    assert chat[0]["id"] == "3/topic"
    assert chat[0]["messages"] == question_messages([{"role": "user", "content": "Doc"}],
                                                    TOPIC, "Pre")
    with pytest.raises(ValueError, match='row 0: no field "prompt" or "messages"'):
        choice_rows({"text": "x"}, QS)
    assert split_id("a/b/topic") == ("a/b", "topic")
    records = [
        {"id": "7/topic", "choice_logprobs": {"c": -3.0, "a": -1.0, "b": -2.0},
         "choice_outside_prob": 0.5},
        {"id": "7/stars", "choice_logprobs": {"1": -1.0, "2": -1.0, "3": -1.0},
         "choice_outside_prob": 0.1},
        {"id": "8/topic", "error": "too long", "choice_logprobs": None}]
    out = answers_from_records(records, QS)
    assert list(out) == ["7"]
    assert out["7"]["topic"]["logprobs"] == {"a": -1.0, "b": -2.0, "c": -3.0}
    assert out["7"]["topic"]["label"] == "a" and out["7"]["topic"]["outside_prob"] == 0.5
    assert out["7"]["stars"]["expected"] == pytest.approx(2.0)
