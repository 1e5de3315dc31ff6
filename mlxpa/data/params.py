"""Per-row sampling fields: type and range checks, and typing of text-only rows (CSV).

Each field of :data:`SAMPLING_FIELDS` maps onto :class:`~mlxpa.config.SamplingParams`; a row
sets only what it needs, and the run's defaults (the CLI options) fill the rest.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mlxpa.config import MAX_N

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
                   "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "min_tokens")
# Fields whose values are token ids (indices into the model's vocabulary): each id is checked
# against the model's vocabulary size by :func:`check_token_ids` before the model runs.
TOKEN_ID_FIELDS = ("stop_token_ids",)
# Constraint and log-probability fields whose CSV text is JSON (mlxpa.data.structured).
JSON_TEXT_FIELDS = ("response_format", "structured_outputs", "guided_choice", "guided_json",
                    "logprobs", "top_logprobs")
# Constraint and log-probability fields (parsed by mlxpa.data.structured).
GUIDED_FIELDS = {"guided_choice": "choice", "guided_regex": "regex", "guided_json": "json",
                 "guided_grammar": "grammar"}
STRUCTURED_FIELDS = ("response_format", "structured_outputs", *GUIDED_FIELDS, "logprobs",
                     "top_logprobs")
_MAX_SHOWN = 60  # characters of an offending value quoted in a message


_INT_MIN = {"max_tokens": 0, "max_completion_tokens": 0, "top_k": 0, "seed": 0,
            "min_tokens": 0}
_FLOAT_RANGE = {  # name: (ok, wanted); NaN and +-Infinity are never accepted
    "temperature": (lambda x: x >= 0, "a finite number >= 0"),
    "top_p": (lambda x: 0 < x <= 1, "a number in (0, 1]"),
    "min_p": (lambda x: 0 <= x <= 1, "a number in [0, 1]"),
}
_BOOLS = ("ignore_eos", "include_stop_str_in_output")


def parse_params(fields: dict, prefix: str, problems: list[str]) -> dict[str, Any]:
    """The sampling fields of ``fields`` (a row or an OpenAI body), checked; each problem is
    appended to ``problems`` with the field named as ``prefix + name``.

    ``max_completion_tokens`` (OpenAI's newer name) wins over ``max_tokens`` when both are set,
    as in vLLM and SGLang (``max_completion_tokens or max_tokens``); both are checked.
    """
    params: dict[str, Any] = {}
    for name in (*SAMPLING_FIELDS, "max_completion_tokens"):
        value = fields.get(name)
        if value is None:
            continue
        v, wanted = _param(name, value)
        if wanted is not None:
            problems.append(bad(prefix + name, wanted, value))
            continue
        params[name] = v
    if "max_completion_tokens" in params:
        params["max_tokens"] = params.pop("max_completion_tokens")
    return params


def check_token_ids(params: dict[str, Any], vocab_size: int, prefix: str = "") -> list[str]:
    """Problems with the token ids of ``params`` (the fields of :data:`TOKEN_ID_FIELDS`):
    every id must index the model's vocabulary, ``0 <= id < vocab_size``.

    Args:
        params: Parsed sampling fields (:func:`parse_params`).
        vocab_size: Rows of the model's embedding / columns of its logits.
        prefix: Put before field names (``"body."`` for OpenAI Batch lines).

    Returns:
        One message per offending field, naming it, the first bad id and the vocabulary size.
    """
    problems = []
    for name in TOKEN_ID_FIELDS:
        bad_ids = [t for t in params.get(name, ()) if not 0 <= t < vocab_size]
        if bad_ids:
            problems.append(f'field "{prefix}{name}": token id {show(bad_ids[0])} is outside '
                            f"the model's vocabulary ({vocab_size} ids, 0..{vocab_size - 1})")
    return problems


def _param(name: str, value: Any) -> tuple[Any, str | None]:
    """``(parsed value, None)``, or ``(None, what was wanted)``."""
    if name == "n":
        v = _as_int(value)
        ok = v is not None and 1 <= v <= MAX_N
        return (v, None) if ok else (None, f"an integer from 1 to {MAX_N}")
    if name in _INT_MIN:
        v = _as_int(value)
        if name == "top_k" and v == -1:  # vLLM's "disabled"
            v = 0
        ok = v is not None and v >= _INT_MIN[name]
        off = " (or -1: off)" if name == "top_k" else ""
        return (v, None) if ok else (None, f"an integer >= {_INT_MIN[name]}{off}")
    if name in _FLOAT_RANGE:
        ok, wanted = _FLOAT_RANGE[name]
        v = _as_float(value)
        return (v, None) if v is not None and ok(v) else (None, wanted)
    if name in _BOOLS:
        return (value, None) if isinstance(value, bool) else (None, "true or false")
    if name == "stop":
        v = [value] if isinstance(value, str) else value
        if isinstance(v, list) and all(isinstance(s, str) and s for s in v):
            return v, None
        return None, "a non-empty string or a list of them"
    # stop_token_ids
    v = value if isinstance(value, list) else [value]
    ids = [_as_int(t) for t in v]
    if all(t is not None and t >= 0 for t in ids):
        return ids, None
    return None, "a token id (an integer >= 0) or a list of them"


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def coerce_text_fields(obj: dict[str, str], messages_column: str) -> dict[str, Any]:
    """Types for a row whose values are all text (CSV): empty cells are null, sampling fields
    and ``messages`` are parsed (JSON for lists and objects; ``stop`` may be plain text), and
    a value that does not parse is kept as text so validation names it."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if value is None or value == "":
            out[key] = None
        elif key == messages_column or (key in SAMPLING_FIELDS and key != "stop") or (
                key in JSON_TEXT_FIELDS):
            out[key] = _loads(value.lower() if value.lower() in ("true", "false") else value)
        elif key == "stop" and value.startswith("["):
            out[key] = _loads(value)
        else:
            out[key] = value
    return out


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # kept as text: validation names the field
        return text


def bad(field: str, wanted: str, value: Any) -> str:
    """``field "x" must be <wanted>, got <value>``."""
    return f'field "{field}" must be {wanted}, got {show(value)}'


def _cut(value: Any) -> str:
    """A short description of a value ``json.dumps`` cannot write (a huge int, deep nesting)."""
    if isinstance(value, int):
        return f"an integer of {value.bit_length()} bits"
    return f"a nested {type(value).__name__}" if isinstance(value, (list, dict)) else "a value"


def show(value: Any) -> str:
    """``value`` as JSON, cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = _cut(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
