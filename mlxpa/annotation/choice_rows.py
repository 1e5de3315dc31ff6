"""Questions as the choice rows ``mlxpa run`` scores today, and their results back as answers.

Each question of a document row becomes one row: its prompt (or messages) as
:mod:`mlxpa.annotation.render` writes it, ``structured_outputs: {"choice": labels}`` and the
id ``"<row id>/<question name>"``; a result record's ``choice_logprobs`` and
``choice_outside_prob`` become the question's :func:`~mlxpa.annotation.answers.answer`. Each
such row repeats the document (the prefix cache shares its full blocks when the rows run
together); the same questions asked through the engine's question rows score the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mlxpa.annotation.answers import answers
from mlxpa.annotation.calibration import Calibration
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.render import prompt_text, question_messages

SEPARATOR = "/"  # between a row's id and a question's name (never in a name)


def question_row(document: str | Sequence[dict], question: Question,
                 preamble: str | None = None, row_id: Any = None) -> dict[str, Any]:
    """The choice row of one question over ``document`` (text: a prompt; a list: messages)."""
    row: dict[str, Any] = {} if row_id is None else {"id": f"{row_id}{SEPARATOR}{question.name}"}
    if isinstance(document, str):
        row["prompt"] = prompt_text(document, question, preamble)
    else:
        row["messages"] = question_messages(document, question, preamble)
    row["structured_outputs"] = {"choice": list(question.labels)}
    return row


def choice_rows(row: dict[str, Any], questions: QuestionSet, *, id_field: str = "id",
                prompt_column: str = "prompt", messages_column: str = "messages",
                index: int = 0) -> list[dict[str, Any]]:
    """One choice row per question of ``questions`` over the row's ``prompt`` or
    ``messages`` (the row's id, else ``index``, prefixes each row's id).

    Raises:
        ValueError: The row has neither a prompt nor messages.
    """
    document = row.get(prompt_column)
    if document is None:
        document = row.get(messages_column)
    if document is None:
        raise ValueError(f'row {index}: no field "{prompt_column}" or "{messages_column}"')
    row_id = row.get(id_field, index)
    return [question_row(document, q, questions.preamble, row_id) for q in questions.questions]


def split_id(record_id: str) -> tuple[str, str]:
    """``(row id, question name)`` of a question row's id."""
    row_id, _, name = str(record_id).rpartition(SEPARATOR)
    return row_id, name


def answers_from_records(records: Iterable[dict[str, Any]], questions: QuestionSet,
                         calibration: Calibration | None = None
                         ) -> dict[str, dict[str, dict[str, Any]]]:
    """Row id (as text) to its ``answers``, from the result records of :func:`choice_rows`'
    rows (records that failed or carry no ``choice_logprobs`` are left out)."""
    scores: dict[str, dict[str, tuple[list[float], float | None]]] = {}
    for record in records:
        row_id, name = split_id(record["id"])
        lp = record.get("choice_logprobs")
        if record.get("error") or lp is None or name not in questions.names:
            continue
        labels = questions[name].labels
        scores.setdefault(row_id, {})[name] = ([lp[c] for c in labels],
                                               record.get("choice_outside_prob"))
    return {row_id: answers(questions, by_name, calibration)
            for row_id, by_name in scores.items()}
