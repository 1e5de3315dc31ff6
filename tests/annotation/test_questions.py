"""Question sets: every type's defaults, the suffix a question adds after the document, and
each problem named by its field (a file's problems by the file too)."""

from __future__ import annotations

import json

import pytest

from mlxpa.annotation.questions import (
    DEFAULT_TEMPLATES,
    Question,
    QuestionSet,
    load_questions,
    parse_question_set,
)

SET = {"preamble": "Read each review.",
       "questions": [
           {"name": "topic", "type": "choice", "labels": ["sports", "politics", "tech"],
            "question": "What is it about?", "gold_field": "topic_gold"},
           {"name": "spam", "type": "yes_no", "question": "Is it spam?"},
           {"name": "quality", "type": "scale", "range": [1, 5], "question": "How good?"},
           {"name": "tone", "type": "scale", "labels": ["bad", "fine", "great"],
            "template": "\nTone ({labels}): "}]}


def _parse(value):
    problems = []
    return parse_question_set(value, "questions", problems), problems


def test_a_set_with_every_type():
    qs, problems = _parse(SET)
    assert problems == []
    assert qs.names == ("topic", "spam", "quality", "tone") and qs.preamble == "Read each review."
    topic, spam, quality, tone = qs.questions
    assert topic == Question("topic", "choice", ("sports", "politics", "tech"),
                             "What is it about?", None, "topic_gold", None)
    assert spam.labels == ("yes", "no") and spam.values is None
    assert quality.labels == ("1", "2", "3", "4", "5")
    assert quality.values == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert tone.values == (1.0, 2.0, 3.0)  # labels that are not numbers: their ranks
    assert qs["spam"] is spam


def test_suffixes():
    topic, spam, quality, tone = _parse(SET)[0].questions
    assert topic.suffix == "\n\nQuestion: What is it about?\nAnswer: "
    assert spam.suffix == "\n\nQuestion: Is it spam?\nAnswer: "
    assert quality.suffix == "\n\nQuestion: How good?\nScale: 1, 2, 3, 4, 5\nAnswer: "
    assert tone.suffix == "\nTone (bad, fine, great): "
    assert set(DEFAULT_TEMPLATES) == {"choice", "yes_no", "scale"}


def test_a_list_is_a_set_without_preamble_and_scale_values():
    qs, problems = _parse([{"name": "q", "type": "scale", "labels": [1, 2, 4],
                            "question": "?"},
                           {"name": "r", "type": "scale", "labels": ["lo", "hi"],
                            "values": [-1, 2.5], "question": "?"},
                           {"name": "s", "type": "yes_no", "labels": ["Yes", "No"],
                            "question": "?"}])
    assert problems == [] and qs.preamble is None
    assert qs["q"].labels == ("1", "2", "4") and qs["q"].values == (1.0, 2.0, 4.0)
    assert qs["r"].values == (-1.0, 2.5) and qs["s"].labels == ("Yes", "No")


def test_a_template_may_leave_out_the_question_and_write_braces():
    qs, problems = _parse([{"name": "q", "type": "choice", "labels": ["a", "b"],
                            "template": " {{json}}: "}])
    assert problems == [] and qs["q"].suffix == " {json}: "


@pytest.mark.parametrize("value, message", [
    ("x", 'field "questions" must be a list of questions or an object with "questions", '
          'got "x"'),
    ({"questions": []}, 'field "questions.questions" must be a non-empty list'),
    ({"questions": [1]}, 'field "questions.questions[0]" must be an object with "name" and '
                         '"type", got 1'),
    ([{"name": "a b", "type": "choice", "labels": ["x", "y"], "question": "?"}],
     'field "questions[0].name" must be a name of letters, digits, _, . or -, got "a b"'),
    ([{"name": "a", "type": "multi", "labels": ["x", "y"]}],
     'field "questions[0].type" must be "choice" or "yes_no" or "scale", got "multi"'),
    ([{"name": "a", "type": "choice", "labels": ["x"], "question": "?"}],
     'field "questions[0].labels" must be a list of 2 or more distinct non-empty strings, '
     'got ["x"]'),
    ([{"name": "a", "type": "choice", "labels": ["x", "x"], "question": "?"}],
     'field "questions[0].labels" must be a list of 2 or more distinct'),
    ([{"name": "a", "type": "yes_no", "labels": ["y", "n", "m"], "question": "?"}],
     'field "questions[0].labels" must be a list of exactly 2 distinct'),
    ([{"name": "a", "type": "scale", "range": [5, 1], "question": "?"}],
     'field "questions[0].range" must be [low, high], integers, low < high'),
    ([{"name": "a", "type": "scale", "range": [1, 3], "labels": ["1"], "question": "?"}],
     'give field "questions[0].labels" or field "questions[0].range", not both'),
    ([{"name": "a", "type": "scale", "labels": ["x", "y"], "values": [2, 1],
       "question": "?"}],
     'field "questions[0].values" must be 2 strictly increasing numbers, one per label'),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"], "range": [1, 2],
       "question": "?"}],
     'field "questions[0].range" is for a "scale" question'),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"]}],
     'field "questions[0].question" is missing (the template asks it)'),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"], "template": "{doc}"}],
     'field "questions[0].template": unknown placeholder {doc}'),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"], "template": "{question"}],
     'field "questions[0].template": '),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"], "question": "?", "lables": 1}],
     'field "questions[0].lables" is unknown (did you mean "labels"?)'),
    ([{"name": "a", "type": "choice", "labels": ["x", "y"], "question": "?"},
      {"name": "a", "type": "yes_no", "question": "?"}],
     'field "questions": question name "a" is given twice'),
    ({"version": 2, "questions": [{"name": "a", "type": "yes_no", "question": "?"}]},
     'field "questions.version" must be 1, got 2'),
    ({"preamble": 3, "questions": [{"name": "a", "type": "yes_no", "question": "?"}]},
     'field "questions.preamble" must be a string, got 3'),
])
def test_problems_name_the_field(value, message):
    qs, problems = _parse(value)
    assert qs is None
    assert any(p.startswith(message) for p in problems), problems


def test_every_problem_is_listed():
    qs, problems = _parse([{"name": "a", "type": "choice", "labels": [], "question": 1},
                           {"name": 7, "type": "yes_no", "question": "?"}])
    assert qs is None and len(problems) == 3, problems


def test_load_questions_names_the_file(tmp_path):
    good = tmp_path / "q.json"
    good.write_text(json.dumps(SET))
    assert load_questions(str(good)).names == ("topic", "spam", "quality", "tone")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"questions": [{"name": "a", "type": "nope"}]}))
    with pytest.raises(ValueError, match=r'^.*bad\.json: field "questions\[0\]\.type" must be'):
        load_questions(str(bad))
    top = tmp_path / "top.json"
    top.write_text("3")
    with pytest.raises(ValueError, match=r"top\.json: the question set must be a list"):
        load_questions(str(top))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        load_questions(str(broken))
    with pytest.raises(ValueError, match=r"missing\.json: No such file"):
        load_questions(str(tmp_path / "missing.json"))


def test_question_set_lookup():
    qs = QuestionSet((Question("a", "yes_no", ("yes", "no"), "?"),))
    assert qs["a"].index("no") == 1
    with pytest.raises(StopIteration):
        qs["b"]


def test_relisted_labels_keep_the_answers_order():
    q = Question("t", "choice", ("a", "b", "c"), "Which?", "{question} ({labels}): ")
    r = q.relisted()
    assert r.labels == q.labels and r.listing == (2, 1, 0)
    assert q.suffix == "Which? (a, b, c): " and r.suffix == "Which? (c, b, a): "
    assert r.relisted().suffix == q.suffix
    assert Question("s", "scale", ("1", "2"), "Ok?").relisted().suffix == (
        "\n\nQuestion: Ok?\nScale: 2, 1\nAnswer: ")
