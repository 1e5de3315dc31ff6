"""Per-row sampling fields: parsed from JSON types, checked by :class:`SamplingParams` itself.

Each field of :data:`SAMPLING_FIELDS` maps onto
:class:`~mlxpa.sampling_params.SamplingParams`; a row sets only what it needs, and the run's
defaults (the CLI options) fill the rest. The ranges are ``SamplingParams``' own (one
definition): a row's field is checked by building the parameters from it alone
(:func:`mlxpa.sampling_params.sampling_field_problem`).
"""

from __future__ import annotations

import json
from typing import Any

from mlxpa.messages import field_error_text, token_id_problem
from mlxpa.sampling_params import sampling_field_problem
from mlxpa.structured.fields import JSON_TEXT_FIELDS

# A row's prompt fields beside its prompt and messages columns: vLLM's TokensPrompt
# ``prompt_token_ids`` (instead of a text), and, with ``messages``, vLLM's chat request fields
# ``chat_template_kwargs`` (more variables of the chat template) and ``add_generation_prompt``.
PROMPT_FIELDS = ("prompt_token_ids", "chat_template_kwargs", "add_generation_prompt")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
                   "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "min_tokens",
                   "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
                   "prompt_logprobs")
# Fields whose values are token ids (indices into the model's vocabulary): each id (of
# ``logit_bias``: each key) is checked against the model's vocabulary size by
# :func:`check_token_ids` before the model runs.
TOKEN_ID_FIELDS = ("stop_token_ids", "logit_bias")
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty")


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
        v = _from_json(name, value)
        wanted = sampling_field_problem(
            "max_tokens" if name == "max_completion_tokens" else name, v)
        if wanted is not None:
            problems.append(field_error_text(prefix + name, wanted, value))
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
        One message per offending field (:func:`mlxpa.messages.token_id_problem`).
    """
    found = (token_id_problem(prefix + name, params.get(name) or (), vocab_size)
             for name in TOKEN_ID_FIELDS)
    return [p for p in found if p is not None]


def _from_json(name: str, value: Any) -> Any:
    """``value`` in the field's Python type where JSON's number types differ from it (an
    integral float such as ``10.0`` for an int field, an int for a float field; one
    ``stop`` string or one stop id as a list; ``logit_bias``' keys, strings in JSON, as
    ints where they spell one); anything else unchanged, for
    :class:`~mlxpa.sampling_params.SamplingParams` to judge."""
    if name in _FLOATS and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # beyond float's range: not a finite number
            return value
    if name == "stop":
        return [value] if isinstance(value, str) else value
    if name == "stop_token_ids":
        return [_as_int(t) for t in value] if isinstance(value, list) else [_as_int(value)]
    if name == "logit_bias":
        return _bias_map(value)
    return _as_int(value)


def _bias_map(value: Any) -> Any:
    """A ``logit_bias`` object with int keys (JSON keys are strings). Parquet gives a map
    column as a list of ``(key, value)`` tuples and a struct column as a dict that holds
    every row's keys, null where this row has none: both read as the row's own object."""
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    if not isinstance(value, dict):
        return value
    return {_token_key(k): v for k, v in value.items() if v is not None}


def _token_key(key: Any) -> Any:
    """A ``logit_bias`` key as an int when it spells a decimal integer (JSON object keys
    are strings: ``"50256"``); anything else unchanged, for the range check to refuse."""
    if isinstance(key, str) and key.isascii() and key.isdecimal() and len(key) <= 20:
        return int(key)
    return _as_int(key)


def _as_int(value: Any) -> Any:
    """An integral float as an int; anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def coerce_text_fields(obj: dict[str, str], messages_column: str) -> dict[str, Any]:
    """Types for a row whose values are all text (CSV): empty cells are null, sampling fields,
    ``messages`` and ``questions`` are parsed (JSON for lists and objects; ``stop`` may be
    plain text), and a value that does not parse is kept as text so validation names it."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if value is None or value == "":
            out[key] = None
        elif key in (messages_column, "questions") or (
                key in SAMPLING_FIELDS and key != "stop") or (
                key in JSON_TEXT_FIELDS or key in PROMPT_FIELDS):
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
