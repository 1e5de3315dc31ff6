"""A row's questions and gold answers: its own ``questions`` field, else the run's set; each
question's gold label from its ``gold_field``, else the ``--gold-column`` field (an object of
question names to labels, or the label itself for one question), read by the question's type
(a label, ignoring case if unique; ``true``/``false`` for ``yes_no``; a label's value for a
``scale``: ``docs/annotation.md``). A null is no gold; any other value that is not an answer
is a problem naming the field.
"""

from __future__ import annotations

from typing import Any

from mlxpa.annotation.questions import Question, QuestionSet, parse_question_set
from mlxpa.messages import field_error_text, quote_value

_TRUE, _FALSE = ("yes", "true"), ("no", "false")


def gold_index(question: Question, value: Any) -> int:
    """The index of the label ``value`` names, by the question's type (module docstring).

    Raises:
        ValueError: ``value`` names none of the question's labels (the message says what
            the question takes).
    """
    if isinstance(value, str):
        if value in question.labels:
            return question.index(value)
        folded = [i for i, c in enumerate(question.labels)
                  if c.strip().casefold() == value.strip().casefold()]
        if len(folded) == 1:
            return folded[0]
        word = value.strip().casefold()
        if question.type == "yes_no" and word in _TRUE + _FALSE:
            return 0 if word in _TRUE else 1
        if question.type == "scale":
            try:
                value = float(value)
            except ValueError:
                pass
    if question.type == "yes_no" and isinstance(value, bool):
        return 0 if value else 1
    if (question.type == "scale" and isinstance(value, (int, float))
            and not isinstance(value, bool) and question.values is not None
            and value in question.values):
        return question.values.index(value)
    raise ValueError(_wanted(question))


def _wanted(question: Question) -> str:
    labels = ", ".join(quote_value(c) for c in question.labels)
    extra = {"yes_no": " or true/false", "scale": " or a label's value"}.get(question.type, "")
    return f"one of question {quote_value(question.name)}'s labels ({labels}){extra}"


def row_questions(fields: dict, default: QuestionSet | None, problems: list[str],
                  prefix: str = "") -> QuestionSet | None:
    """The questions a row is asked: its ``questions`` field, else ``default`` (None: none);
    problems with the field are appended naming ``prefix + "questions"``."""
    value = fields.get("questions")
    if value is None:
        return default
    return parse_question_set(value, prefix + "questions", problems)


def row_gold(fields: dict, questions: QuestionSet, gold_column: str | None,
             problems: list[str], prefix: str = "") -> dict[str, int]:
    """Question name to the row's gold label index, for the questions that have one.

    Args:
        fields: The row.
        questions: The questions it is asked.
        gold_column: The ``--gold-column`` field, or None.
        problems: Each problem is appended, naming the field.
        prefix: Put before field names (``"body."``).
    """
    out: dict[str, int] = {}
    given = fields.get(gold_column) if gold_column is not None else None
    by_name = _gold_object(given, questions, f"{prefix}{gold_column}", problems)
    for q in questions.questions:
        if q.gold_field is not None:
            value, where = fields.get(q.gold_field), prefix + q.gold_field
        else:
            value, where = by_name.get(q.name), f"{prefix}{gold_column}"
            if isinstance(given, dict):
                where += f".{q.name}"
        if value is None:
            continue
        try:
            out[q.name] = gold_index(q, value)
        except ValueError as e:
            problems.append(field_error_text(where, str(e), value))
    return out


def _gold_object(given: Any, questions: QuestionSet, field: str,
                 problems: list[str]) -> dict[str, Any]:
    """The ``--gold-column`` value as question name to gold value."""
    if given is None:
        return {}
    if isinstance(given, dict):
        unknown = [k for k in given if k not in questions.names]
        if unknown:
            problems.append(f'field "{field}": {quote_value(unknown[0])} is not a question of '
                            f"the row ({', '.join(questions.names)})")
        return given
    ungolded = [q for q in questions.questions if q.gold_field is None]
    if len(ungolded) == 1:
        return {ungolded[0].name: given}
    problems.append(field_error_text(
        field, "an object of question names to gold labels (the row is "
        f"asked {len(ungolded)} questions)", given))
    return {}
