"""How messages quote a user's value and name a field, stated once for rows, the API and the
CLI: :class:`FieldError` (a field outside its range), :func:`quote_value`,
:func:`field_error_text` and :func:`token_id_problem`. No mlx."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from mlxpa.utils import is_int

MAX_QUOTED_CHARS = 60  # characters of an offending value quoted in a message


class FieldError(ValueError):
    """One configuration field outside its range: ``"<field> must be <wanted>, got <value>"``.

    Attributes:
        field: The field's name.
        wanted: What the field must be (``"an integer >= 0"``), the words row messages use.
    """

    def __init__(self, field: str, wanted: str, value: object) -> None:
        super().__init__(f"{field} must be {wanted}, got {value!r}")
        self.field = field
        self.wanted = wanted


def check_field(ok: bool, field: str, value: object, wanted: str) -> None:
    """Raise :class:`FieldError` ``(field, wanted, value)`` unless ``ok``."""
    if not ok:
        raise FieldError(field, wanted, value)


def quote_value(value: Any) -> str:
    """``value`` as JSON, cut to :data:`MAX_QUOTED_CHARS` (how messages quote a user's
    value)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = _describe(value)
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    return text[: MAX_QUOTED_CHARS - 3] + "..."


def _describe(value: Any) -> str:
    """A short description of a value ``json.dumps`` cannot write (a huge int, deep nesting)."""
    if isinstance(value, int):
        return f"an integer of {value.bit_length()} bits"
    return f"a nested {type(value).__name__}" if isinstance(value, (list, dict)) else "a value"


def field_error_text(field: str, wanted: str, value: Any) -> str:
    """``field "x" must be <wanted>, got <value>`` (a row's field)."""
    return f'field "{field}" must be {wanted}, got {quote_value(value)}'


def token_id_problem(field: str, ids: Iterable[object], vocab_size: int) -> str | None:
    """The problem with the first of ``ids`` that does not index the model's vocabulary (an
    int in ``[0, vocab_size)``), or None when every id does.

    Returns:
        ``field "<field>": token id <id> is outside the model's vocabulary (<V> ids,
        0..<V - 1>)``, or None.
    """
    bad_id = next((t for t in ids if not (is_int(t) and 0 <= t < vocab_size)), None)
    if bad_id is None:
        return None
    return (f'field "{field}": token id {quote_value(bad_id)} is outside the model\'s '
            f"vocabulary ({vocab_size} ids, 0..{vocab_size - 1})")
