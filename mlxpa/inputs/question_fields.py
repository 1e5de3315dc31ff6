"""The questions a request is asked and its gold labels (:mod:`mlxpa.annotation`), read as the
request schema reads its other fields: its own ``questions`` field, else the source's set
(``--questions``); a question's ``gold_field`` or the ``--gold-column`` field (an object
written as JSON text in a CSV cell too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mlxpa.annotation.gold import row_gold, row_questions
from mlxpa.annotation.questions import QuestionSet


def parse_questions(fields: Mapping[str, Any], default: QuestionSet | None,
                    gold_field: str | None, problems: list[str], *, prompt_fields: str,
                    token_ids: bool, constrained: bool
                    ) -> tuple[QuestionSet | None, dict[str, int] | None]:
    """The questions a request is asked (its ``questions`` field, else ``default``) and its
    gold label indices (question name to index, from each question's ``gold_field`` or the
    ``gold_field`` field), or ``(None, None)``; every problem appended naming the field.

    A request asked questions is scored, not decoded: it needs a text prompt or messages
    (``token_ids``: it gives token ids; ``prompt_fields``: how they are named) and no
    constraint of its own (``constrained``).
    """
    before = len(problems)
    questions = row_questions(fields, default, problems)
    if questions is None:
        return None, None
    given = fields.get("questions") is not None
    if token_ids:
        problems.append('field "prompt_token_ids": a row asked questions needs a text '
                        f'{prompt_fields}')
    if constrained:  # scored, not decoded: a constraint would be ignored
        problems.append('give field "questions" or a constraint (structured_outputs, '
                        "guided_*, response_format), not both" if given else
                        "a row asked the run's questions (--questions) takes no constraint "
                        "of its own (structured_outputs, guided_*, response_format)")
    gold_fields, column = dict(fields), gold_field
    if column is not None and isinstance(fields.get(column), str) and fields[column][:1] == "{":
        try:  # an object read from CSV as JSON text
            gold_fields[column] = json.loads(fields[column])
        except ValueError:
            pass  # kept as text: the gold check names the field
    gold = row_gold(gold_fields, questions, column, problems)
    return (questions, gold) if len(problems) == before else (None, None)
