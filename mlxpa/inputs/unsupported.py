"""The request fields of the OpenAI and vLLM APIs that are not sampling fields, in one table
(:data:`FIELD_SUPPORT`): ``ignored`` (they do not change the completion: accepted, dropped),
``unsupported`` (refused by name and why, unless set to the API's default) or ``supported``
(read by the request schema, :mod:`mlxpa.inputs.schema`); and the hint for a near miss of a
sampling field's name.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, NamedTuple

from mlxpa.messages import quote_value
from mlxpa.sampling_params import REQUEST_FIELDS as SAMPLING_FIELDS


class FieldRule(NamedTuple):
    """How a row treats one request field.

    Attributes:
        status: ``supported`` (read elsewhere), ``ignored`` or ``unsupported``.
        defaults: Values that restate the API's default (an ``unsupported`` field set to one
            of them changes nothing, so it is accepted); None and absent are always accepted.
        reason: Why an ``unsupported`` field is refused (what is missing, and what to use
            instead where something does the job), quoted in the row's error.
    """

    status: str
    defaults: tuple[Any, ...] = ()
    reason: str = ""


_OFF = (False, 0, [], {}, "")
_IGNORED = FieldRule("ignored")
_SUPPORTED = FieldRule("supported")


def _unsupported(reason: str, *defaults: Any) -> FieldRule:
    return FieldRule("unsupported", (*_OFF, *defaults), reason)


_TOOLS = "tool calling is not implemented (no tool-call parsing)"

# OpenAI Chat/Completions and vLLM request fields that are not mlxpa sampling fields.
FIELD_SUPPORT: dict[str, FieldRule] = {
    # metadata of the request, not of the completion
    "model": _IGNORED, "user": _IGNORED, "metadata": _IGNORED, "store": _IGNORED,
    "service_tier": _IGNORED,
    # only meaningful with tools, which are unsupported (so never set)
    "parallel_tool_calls": _IGNORED,
    # a batch never streams: stream false (the default) and its options are meaningless
    "stream": FieldRule("unsupported", (False,)),
    "stream_options": _IGNORED,
    # structured outputs and log-probabilities (mlxpa.structured.fields reads them)
    "response_format": _SUPPORTED, "logprobs": _SUPPORTED, "top_logprobs": _SUPPORTED,
    "guided_json": _SUPPORTED, "guided_regex": _SUPPORTED, "guided_choice": _SUPPORTED,
    "guided_grammar": _SUPPORTED, "structured_outputs": _SUPPORTED,
    # penalties, logit bias and prompt log-probabilities (sampling fields)
    "prompt_logprobs": _SUPPORTED, "presence_penalty": _SUPPORTED,
    "frequency_penalty": _SUPPORTED, "repetition_penalty": _SUPPORTED,
    "logit_bias": _SUPPORTED,
    "allowed_token_ids": _unsupported(
        "restricting the vocabulary is not implemented (a guided_choice, guided_regex or "
        "logit_bias of -100 does the job)"),
    "bad_words": _unsupported("banning words is not implemented (logit_bias -100 bans "
                              "single tokens)"),
    "best_of": _unsupported("ranking best_of samples by log-probability is not "
                            "implemented; use n and logprobs", 1),
    "use_beam_search": _unsupported("beam search is not implemented"),
    "length_penalty": _unsupported("it only weighs beam search, which is not implemented",
                                   1, 1.0),
    "typical_p": _unsupported("typical sampling is not implemented; use top_p or min_p",
                              1, 1.0),
    "tools": _unsupported(_TOOLS), "tool_choice": _unsupported(_TOOLS, "none"),
    "functions": _unsupported(_TOOLS), "function_call": _unsupported(_TOOLS, "none"),
    "echo": _unsupported("echoing the prompt is not implemented (prompt_logprobs gives "
                         "its log-probabilities)"),
    "suffix": _unsupported("insertion after a suffix (fill-in-the-middle) is not "
                           "implemented"),
    "reasoning_effort": _unsupported("reasoning controls are not implemented"),
    "modalities": _unsupported("only text output is produced", ["text"]),
    "audio": _unsupported("only text output is produced"),
    "prediction": _unsupported("predicted outputs are not implemented"),
    "web_search_options": _unsupported("a batch run has no web search"),
    # vLLM's detokenizer fields: mlxpa's text keeps the special tokens the model writes
    # (mlx-lm's streaming detokenizers), with nothing put between them
    "skip_special_tokens": _unsupported(
        "the text keeps the special tokens the model writes (give false)"),
    "spaces_between_special_tokens": _unsupported(
        "nothing is put between special tokens in the text (give false)"),
}


def unsupported_fields() -> frozenset[str]:
    """Names of the fields that are errors unless they restate a default."""
    return frozenset(k for k, r in FIELD_SUPPORT.items() if r.status == "unsupported")


def field_problem(name: str, key: str, value: Any) -> str | None:
    """The problem with field ``key`` set to ``value`` (shown as ``name``), or None when the
    row may have it: unknown to the table, ``supported``, ``ignored``, or set to a default.

    Numbers compare by value (``0`` and ``0.0`` restate the default alike); a bool is never
    taken for a number (``true`` is not ``1``).
    """
    rule = FIELD_SUPPORT.get(key)
    if rule is None or rule.status != "unsupported" or value is None:
        return None
    if any(_same(value, d) for d in rule.defaults):
        return None
    if key == "stream":
        return f'field "{name}" must be false (a batch does not stream), got {quote_value(value)}'
    return f'field "{name}" is not supported by mlxpa: {rule.reason}'


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return value == default
    return type(value) is type(default) and value == default


def unknown_field(name: str, key: str) -> str:
    """``field "x": unknown sampling field`` with the closest sampling field as a hint."""
    close = difflib.get_close_matches(key, SAMPLING_FIELDS, 1, 0.8)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f'field {quote_value(name)}: unknown sampling field{hint}'


_UNSUPPORTED = unsupported_fields()


@functools.lru_cache(maxsize=4096)
def sampling_like(key: str) -> bool:
    """An unsupported sampling field, or a near miss of a supported one."""
    return key in _UNSUPPORTED or bool(
        difflib.get_close_matches(key, SAMPLING_FIELDS, 1, 0.8))
