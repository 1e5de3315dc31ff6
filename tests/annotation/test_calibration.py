"""Calibrating a question set on labelled rows, and the calibration file."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from scipy.special import log_softmax

from mlxpa.annotation.calibration import apply_calibration, calibrate
from mlxpa.annotation.calibration_file import (
    calibration_dict,
    load_calibration,
    save_calibration,
)
from mlxpa.annotation.metrics import quality
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.temperature import (
    CONTENT_FREE,
    calibrated_probs,
    fit_temperature,
    split_rows,
)

TOPIC = Question("topic", "choice", ("a", "b", "c", "d"), "?")
STARS = Question("stars", "scale", ("1", "2", "3"), "?", values=(1.0, 2.0, 3.0))
QS = QuestionSet((TOPIC, STARS))


def _overconfident(seed: int, n: int, k: int):
    """Scores three times too sharp: the gold label is drawn from ``softmax(logits / 3)``,
    so the raw probabilities are far above the accuracy and ``T = 3`` calibrates them."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 5
    true = np.exp(log_softmax(logits / 3, axis=1))
    gold = np.array([rng.choice(k, p=p) for p in true])
    return log_softmax(logits, axis=1), gold


def test_calibrate_fits_on_one_part_and_reports_the_other():
    lp_t, gold_t = _overconfident(0, 2000, 4)
    lp_s, gold_s = _overconfident(1, 2000, 3)
    gold_s[:100] = -1  # rows without gold are left out
    cal = calibrate(QS, {"topic": lp_t, "stars": lp_s}, {"topic": gold_t, "stars": gold_s},
                    seed=3, holdout=0.25, budget=0.1)
    t = cal.questions["topic"]
    assert (t.num_fit, t.num_heldout) == (1500, 500) and t.bias is None
    assert cal.content_free is None and cal.seed == 3 and cal.error_budget == 0.1
    held = split_rows(2000, 0.25, 3)
    assert t.temperature == pytest.approx(fit_temperature(lp_t[~held], gold_t[~held]))
    assert t.before == quality(gold_t[held], calibrated_probs(lp_t[held]), budget=0.1)
    assert t.temperature == pytest.approx(3, rel=0.15)
    assert t.after["ece"] <= t.before["ece"] / 2
    assert t.after["log_loss"] < t.before["log_loss"]
    assert t.after["accuracy"] == t.before["accuracy"]  # a temperature keeps the argmax
    s = cal.questions["stars"]
    assert s.num_fit + s.num_heldout == 1900 and "kappa_quadratic" in s.after


def test_contextual_bias_is_measured_and_recorded():
    lp, gold = _overconfident(2, 500, 4)
    cf = np.log(np.array([[0.7, 0.1, 0.1, 0.1]] * 3))
    cal = calibrate(QuestionSet((TOPIC,)), {"topic": lp}, {"topic": gold},
                    content_free_logprobs={"topic": cf})
    q = cal.questions["topic"]
    np.testing.assert_allclose(np.exp(q.bias), [0.7, 0.1, 0.1, 0.1])
    assert cal.content_free == CONTENT_FREE
    np.testing.assert_allclose(apply_calibration(q, lp[:5]),
                               calibrated_probs(lp[:5], q.temperature, q.bias))
    np.testing.assert_allclose(apply_calibration(None, lp[:5]), calibrated_probs(lp[:5]))


def test_no_labelled_row_to_fit():
    lp, gold = _overconfident(4, 10, 4)
    with pytest.raises(ValueError, match="no labelled row to fit on"):
        calibrate(QuestionSet((TOPIC,)), {"topic": lp}, {"topic": np.full(10, -1)})


def test_the_file_round_trips(tmp_path):
    lp, gold = _overconfident(5, 300, 4)
    cal = calibrate(QuestionSet((TOPIC,)), {"topic": lp}, {"topic": gold},
                    content_free_logprobs={"topic": lp[:3]}, model="gemma")
    path = tmp_path / "cal.json"
    save_calibration(cal, path)
    obj = json.loads(path.read_text())
    assert obj["format"] == "mlxpa-calibration" and obj["version"] == 1
    assert set(obj["questions"]["topic"]["bias"]) == {"a", "b", "c", "d"}
    again = load_calibration(path, QS)
    assert again == cal
    assert calibration_dict(again) == obj


def _write(tmp_path, obj):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(obj))
    return str(path)


GOOD = {"format": "mlxpa-calibration", "version": 1,
        "questions": {"topic": {"labels": ["a", "b", "c", "d"], "temperature": 1.5}}}


def test_a_minimal_file_and_questions_it_does_not_know(tmp_path):
    path = _write(tmp_path, {**GOOD, "questions": {**GOOD["questions"],
                                                   "other": {"labels": ["x", "y"],
                                                             "temperature": 2}}})
    cal = load_calibration(path, QS)
    assert list(cal.questions) == ["topic"] and cal.questions["topic"].temperature == 1.5
    assert list(load_calibration(path).questions) == ["topic", "other"]


@pytest.mark.parametrize("change, message", [
    ({"format": "x"}, 'not a calibration file (no "format": "mlxpa-calibration")'),
    ({"version": 2}, 'field "version" must be 1 (this mlxpa\'s calibration format), got 2'),
    ({"questions": []}, 'field "questions" must be an object of question names'),
    ({"questions": {"topic": {"labels": ["a", "b", "c", "d"], "temperature": 0}}},
     'field "questions.topic.temperature" must be a number > 0, got 0'),
    ({"questions": {"topic": {"labels": ["a", "b", "c", "d"], "temperature": 1,
                              "bias": {"a": 1}}}},
     'field "questions.topic.bias" must be null or a number for each label'),
    ({"questions": {"topic": {"labels": ["b", "a", "c", "d"], "temperature": 1}}},
     'field "questions.topic.labels" ["b", "a", "c", "d"] are not question "topic"\'s labels'),
    ({"questions": {"topic": {"labels": "abcd", "temperature": 1}}},
     'field "questions.topic.labels" must be a list of 2 or more distinct labels'),
    ({"seed": "0"}, 'field "seed" must be an integer, got "0"'),
    ({"holdout": 2}, 'field "holdout" must be a number in [0, 1], got 2'),
])
def test_file_problems_name_the_file_and_field(tmp_path, change, message):
    path = _write(tmp_path, {**GOOD, **change})
    with pytest.raises(ValueError) as e:
        load_calibration(path, QS)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value), str(e.value)


def test_unreadable_files(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        load_calibration(broken)
    with pytest.raises(ValueError, match="No such file"):
        load_calibration(tmp_path / "none.json")


def test_a_calibration_fitted_on_few_rows_is_bounded_and_warned_of_at_use(tmp_path):
    from mlxpa.annotation.temperature import TEMPERATURE_BOUNDS, fit_temperature

    lp = np.log(np.array([[0.6, 0.4], [0.3, 0.7]] * 9))  # 18 rows, every one answered right
    t = fit_temperature(lp, np.array([0, 1] * 9))
    assert t == pytest.approx(TEMPERATURE_BOUNDS[0], rel=1e-3) and t >= 0.25
    assert calibrated_probs(lp[:1], t)[0, 0] < 0.9  # not a certainty from 18 rows
    topic = {"labels": ["a", "b", "c", "d"], "temperature": 0.038, "num_fit": 18}
    path = _write(tmp_path, {**GOOD, "questions": {"topic": topic}})
    with pytest.warns(UserWarning, match=r"question 'topic' was fitted on 18 rows \(fewer "
                                         r"than 30\): its calibrated probs are not to be "):
        load_calibration(path, QS)
    ends = {**topic, "num_fit": 400, "temperature": 20.0}
    with pytest.warns(UserWarning, match="at the end of its range"):
        load_calibration(_write(tmp_path, {**GOOD, "questions": {"topic": ends}}), QS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_calibration(_write(tmp_path, GOOD), QS)  # a temperature set by hand
