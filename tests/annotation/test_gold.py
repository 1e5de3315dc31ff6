"""A row's questions and gold labels: each type's gold values, the two places gold comes from,
and problems named by their field."""

from __future__ import annotations

import pytest

from mlxpa.annotation.gold import gold_index, row_gold, row_questions
from mlxpa.annotation.questions import parse_question_set

QS = parse_question_set([
    {"name": "topic", "type": "choice", "labels": ["Sports", "politics"], "question": "?"},
    {"name": "spam", "type": "yes_no", "question": "?", "gold_field": "is_spam"},
    {"name": "stars", "type": "scale", "range": [1, 5], "question": "?"},
    {"name": "tone", "type": "scale", "labels": ["low", "high"], "values": [0, 10],
     "question": "?"}], "questions", [])


@pytest.mark.parametrize("name, value, index", [
    ("topic", "Sports", 0), ("topic", " sports ", 0), ("topic", "POLITICS", 1),
    ("spam", True, 0), ("spam", False, 1), ("spam", "no", 1), ("spam", "True", 0),
    ("spam", "yes", 0),
    ("stars", "3", 2), ("stars", 3, 2), ("stars", 5.0, 4), ("stars", "5.0", 4),
    ("tone", 10, 1), ("tone", "low", 0),
])
def test_gold_values_by_type(name, value, index):
    assert gold_index(QS[name], value) == index


@pytest.mark.parametrize("name, value", [
    ("topic", "tech"), ("topic", 1), ("topic", True), ("spam", "maybe"), ("spam", 1),
    ("stars", 6), ("stars", "six"), ("stars", True), ("tone", 5)])
def test_values_that_are_no_label(name, value):
    with pytest.raises(ValueError, match=f"one of question \"{name}\"'s labels"):
        gold_index(QS[name], value)


def test_gold_from_a_gold_field_and_an_object_column():
    problems = []
    row = {"is_spam": False, "gold": {"topic": "politics", "stars": 4}}
    assert row_gold(row, QS, "gold", problems) == {"topic": 1, "spam": 1, "stars": 3}
    assert problems == []
    assert row_gold({"gold": None}, QS, "gold", problems) == {} and problems == []
    assert row_gold({"is_spam": "yes"}, QS, None, problems) == {"spam": 0}


def test_a_plain_gold_column_for_a_row_of_one_question():
    one = parse_question_set([{"name": "q", "type": "yes_no", "question": "?"}], "questions", [])
    problems = []
    assert row_gold({"label": "no"}, one, "label", problems) == {"q": 1} and problems == []


def test_gold_problems_name_the_field():
    problems = []
    row_gold({"is_spam": "perhaps", "gold": {"topic": "tech", "mood": "x"}}, QS, "gold",
             problems, prefix="body.")
    assert problems == [
        'field "body.gold": "mood" is not a question of the row (topic, spam, stars, tone)',
        'field "body.gold.topic" must be one of question "topic"\'s labels ("Sports", '
        '"politics"), got "tech"',
        'field "body.is_spam" must be one of question "spam"\'s labels ("yes", "no") or '
        'true/false, got "perhaps"']
    problems = []
    row_gold({"gold": "Sports"}, QS, "gold", problems)
    assert problems == ['field "gold" must be an object of question names to gold labels '
                        '(the row is asked 3 questions), got "Sports"']


def test_a_rows_own_questions_win_over_the_runs():
    problems = []
    own = row_questions({"questions": [{"name": "x", "type": "yes_no", "question": "?"}]},
                        QS, problems)
    assert own.names == ("x",) and problems == []
    assert row_questions({}, QS, problems) is QS
    assert row_questions({}, None, problems) is None
    assert row_questions({"questions": [{"name": "x"}]}, QS, problems, "body.") is None
    assert problems == ['field "body.questions[0].type" must be "choice" or "yes_no" or '
                        '"scale", got null']
