"""How messages quote a user's value and name a field, stated once for rows, the API and the
CLI: :class:`FieldError` (a field outside its range), :func:`quote_value`, :func:`json_type`,
:func:`field_error_text`, :func:`token_id_problem` and :func:`surrogate_problem`. No mlx."""

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


def json_type(value: Any) -> str:
    """``a string``, ``an array``, ... for a decoded JSON value that is not an object."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


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


def request_token_id_problem(ids: dict[str, Any], vocab_size: int) -> str | None:
    """:func:`token_id_problem` of every id a request gives, by field name (its prompt, its
    ``stop_token_ids``, its ``logit_bias`` keys): an id out of range would read another row
    of the embedding, or scatter into another request's logits."""
    for name, values in ids.items():
        problem = token_id_problem(name, values or (), vocab_size)
        if problem is not None:
            return problem
    return None


def surrogate_problem(value: Any, field: str = "") -> str | None:
    """Why ``value`` is not Unicode text: its first string (or key) holding a lone surrogate,
    which JSON's ``\\ud800`` escape can spell but UTF-8 cannot encode (a tokenizer, a
    template or an output writer would fail on it); None when every string is text.

    Args:
        value: A string, or lists and dicts holding strings (walked without recursion).
        field: The name of ``value``; ``""`` for a record, whose keys are the field names.

    Returns:
        ``field "messages[0].content" is not Unicode text: a lone surrogate \\ud800 at
        character 3 (JSON's \\uD800-\\uDFFF escapes must come in pairs)``, or None.
    """
    stack: list[tuple[str, Any]] = [(field, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            at = _surrogate_at(item)
            if at is not None:
                return (f'field "{_printable(where)}" is not Unicode text: a lone surrogate '
                        f"{ascii(item[at])[1:-1]} at character {at + 1} (JSON's \\uD800-"
                        "\\uDFFF escapes must come in pairs)")
        elif isinstance(item, dict):
            for key, v in reversed(item.items()):
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and _surrogate_at(key) is not None:
                    return f'field name "{_printable(name)}" is not Unicode text (a lone surrogate)'
                stack.append((name, v))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def _surrogate_at(text: str) -> int | None:
    """The index of ``text``'s first lone surrogate, or None (UTF-8 encodes every other
    code point)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _printable(name: str) -> str:
    """A field name with any surrogate written as its escape (a message must be text)."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")
