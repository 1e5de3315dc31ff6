"""A row's questions and gold labels (:mod:`mlxpa.annotation`): its own ``questions`` field,
else the run's ``--questions`` set, and its gold labels (a question's ``gold_field``, or the
``--gold-column`` field), each problem named by the field like a row's other fields.

A row asked questions is scored, not decoded: it needs a text ``prompt`` or ``messages`` (the
document) and no constraint of its own; its sampling fields do not apply. A ``--gold-column``
value read from CSV may be an object written as JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from mlxpa.annotation.gold import row_gold, row_questions
from mlxpa.annotation.questions import QuestionSet
from mlxpa.data.inputs import InputOptions


def parse_questions(fields: dict[str, Any], options: InputOptions, problems: list[str], *,
                    token_ids: bool, constrained: bool
                    ) -> tuple[QuestionSet | None, dict[str, int] | None]:
    """The questions a row is asked and its gold label indices (question name to index),
    or ``(None, None)`` for a row asked none; problems appended naming the field.

    Args:
        fields: The row's fields.
        options: The run's reader settings (its question set and gold column).
        problems: The row's problems so far.
        token_ids: The row gives ``prompt_token_ids`` (no text to put a question after).
        constrained: The row gives a constraint of its own (``structured_outputs``, ...).
    """
    before = len(problems)
    questions = row_questions(fields, options.questions, problems)
    if questions is None:
        return None, None
    given = fields.get("questions") is not None
    if token_ids:
        problems.append('field "prompt_token_ids": a row asked questions needs a text '
                        f'"{options.prompt_column}" or "{options.messages_column}"')
    if constrained:  # scored, not decoded: a constraint would be ignored
        problems.append('give field "questions" or a constraint (structured_outputs, '
                        "guided_*, response_format), not both" if given else
                        "a row asked the run's questions (--questions) takes no constraint "
                        "of its own (structured_outputs, guided_*, response_format)")
    gold_fields = dict(fields)
    column = options.gold_column
    if column is not None and isinstance(fields.get(column), str) and fields[column][:1] == "{":
        try:
            gold_fields[column] = json.loads(fields[column])
        except ValueError:
            pass  # kept as text: the gold check names the field
    gold = row_gold(gold_fields, questions, column, problems)
    return (questions, gold) if len(problems) == before else (None, None)
