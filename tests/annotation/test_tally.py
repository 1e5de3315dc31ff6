"""A run's answers counted: per-question gold figures (scikit-learn's on the same arrays), the
rows a calibration is fitted on (input order), the label order check's counts (by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score

from mlxpa.annotation.answers import answer
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.tally import AnswerTally

TOPIC = Question("topic", "choice", ("a", "b", "c"))
SPAM = Question("spam", "yes_no", ("yes", "no"))
QS = QuestionSet((TOPIC, SPAM))


def _answers(topic_lp, spam_lp, permuted=None):
    out = {"topic": answer(TOPIC, topic_lp), "spam": answer(SPAM, spam_lp)}
    if permuted is not None:
        out["topic"]["permuted_label"] = permuted
    return out


def test_figures_are_the_gold_rows_and_match_scikit_learn():
    rng = np.random.default_rng(0)
    tally = AnswerTally()
    logprobs = rng.normal(size=(40, 3))
    gold = rng.integers(0, 3, size=40)
    order = rng.permutation(40)  # rows finish out of input order
    for i in order:
        golds = {"topic": int(gold[i])} if i % 4 else {}  # every 4th row has none
        tally.add(QS, _answers(logprobs[i].tolist(), [-1.0, -2.0]), golds, None, int(i))
    figures = tally.figures()
    assert list(figures["questions"]) == ["topic"] and "label_order" not in figures
    keep = np.arange(40) % 4 != 0
    pred = logprobs[keep].argmax(axis=1)
    f = figures["questions"]["topic"]
    assert f["n"] == keep.sum()
    assert f["accuracy"] == pytest.approx(accuracy_score(gold[keep], pred))
    assert f["macro_f1"] == pytest.approx(f1_score(gold[keep], pred, average="macro"))
    assert f["kappa"] == pytest.approx(cohen_kappa_score(gold[keep], pred))
    question, x, g = tally.golded()["topic"]
    assert question == TOPIC
    np.testing.assert_allclose(x, logprobs[keep])  # in input order
    np.testing.assert_array_equal(g, gold[keep])
    assert tally.rows == 40 and [t.title for t in tally.tables()] == [
        "topic: answers against gold labels"]


def test_label_order_counts_by_hand():
    tally = AnswerTally()
    lp = [math.log(0.5), math.log(0.3), math.log(0.2)]
    tally.add(QS, _answers(lp, [-1.0, -2.0], permuted="a"), None, [], 0)
    tally.add(QS, _answers(lp, [-1.0, -2.0], permuted="c"), None, ["topic"], 1)
    tally.add(QS, _answers(lp, [-1.0, -2.0], permuted="a"), None, [], 2)
    tally.add(QS, _answers(lp, [-1.0, -2.0]), None, None, 3)  # not checked
    order = tally.figures()["label_order"]
    assert order == {"rows": 3, "changed_rows": 1, "changed_share": 1 / 3,
                     "questions": {"topic": {"rows": 3, "changed": 1,
                                             "changed_share": 1 / 3}}}
    assert tally.tables()[-1].row_count == 2


def test_questions_sharing_a_name_with_other_labels_are_kept_apart():
    tally = AnswerTally()
    other = Question("topic", "choice", ("x", "y"))
    tally.add(QS, _answers([0.0, -1.0, -2.0], [-1.0, -2.0]), {"topic": 0}, None, 0)
    tally.add(QuestionSet((other,)), {"topic": answer(other, [-2.0, 0.0])}, {"topic": 1},
              None, 1)
    assert sorted(tally.figures()["questions"]) == ["topic ['a', 'b', 'c']", "topic ['x', 'y']"]
