"""One input record (a JSON object, a Parquet/CSV/``datasets`` row) to a validated :class:`Row`.

Every problem is collected, not raised, and named with the source, line (or row) and field, so
a validation pass can list them all before any model work:

* the input: ``prompt`` (non-empty text) *or* ``messages`` (a non-empty list of
  ``{"role", "content"}`` strings) *or* ``prompt_token_ids`` (vLLM's TokensPrompt: a
  non-empty list of token ids), nulls reported as such; with ``messages``, vLLM's
  ``chat_template_kwargs`` (an object) and ``add_generation_prompt`` (a bool) for the
  template;
* the id (a string or an integer; default: the row index);
* per-row sampling fields (:data:`SAMPLING_FIELDS`), type- and range-checked; constraint and
  log-probability fields (:mod:`mlxpa.structured.fields`), compiled;
* request fields mlxpa does not support (``use_beam_search``, ``tools``, ...; the error says
  why) and near misses of supported names (``temprature``) are errors; any other field
  passes through (it can be carried to the output with ``--keep-columns``);
* OpenAI Batch API lines (``custom_id``, ``method``, ``url``, ``body``): the id is
  ``custom_id`` and every field of ``body`` must be known.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlxpa.data.fields import (
    FIELD_SUPPORT,
    check_body_fields,
    check_openai,
    field_problem,
    unknown_field,
)
from mlxpa.data.inputs import RowSpec, sampling_like, where
from mlxpa.data.params import PROMPT_FIELDS, parse_params
from mlxpa.data.questions import parse_questions
from mlxpa.inputs.prompts import (
    parse_messages,
    template_kwargs_problem,
    text_problem,
    token_ids_problem,
)
from mlxpa.messages import field_error_text, quote_value, surrogate_problem
from mlxpa.structured.fields import parse_structured

if TYPE_CHECKING:
    from mlxpa.annotation.questions import QuestionSet


@dataclass(frozen=True, slots=True)
class Row:
    """One input row, validated.

    Attributes:
        index: 0-based position among the input's rows (blank JSONL lines skipped).
        id: The row's id field (str or int); defaults to ``index``; None for a record that
            could not be decoded.
        prompt: Text prompt, or None when ``messages`` or ``prompt_token_ids`` is given.
        messages: Chat messages (``[{"role": str, "content": str, ...}]``, null keys dropped),
            or None.
        params: Per-row sampling overrides, only the fields the row sets (nulls are absent):
            ints for ``max_tokens`` (>= 0), ``top_k`` (>= 0, or -1: off), ``seed``
            (>= 0), ``n`` (>= 1), ``min_tokens`` (>= 0); floats for ``temperature`` (>= 0),
            ``top_p`` (in (0, 1]), ``min_p`` (in [0, 1]); ``stop`` a list of non-empty strings
            and ``stop_token_ids`` a list of ints >= 0 (a single value becomes a one-element
            list); bools for ``ignore_eos`` and ``include_stop_str_in_output``; floats for
            ``repetition_penalty`` (> 0), ``presence_penalty`` and ``frequency_penalty``
            (in [-2, 2]); ``logit_bias`` a dict of int token ids to floats in [-100, 100]
            (JSON's string keys read as ints); ``prompt_logprobs`` an int in [0, 20].
            Integral floats such as ``10.0`` are accepted as ints.
        error: Why the row cannot run (the full message with source, line and field), or None.
            When set, ``prompt``, ``messages`` and ``params`` hold only what was valid.
        line: Where the row came from: 1-based line (JSONL, CSV) or 0-based row (Parquet,
            ``datasets``).
        keep: Values of the ``--keep-columns`` fields (None for a missing one), or None when
            no columns are kept.
        openai: ``"chat"`` or ``"completions"`` for an OpenAI Batch API line, else None.
        prompt_token_ids: The prompt as token ids (ints >= 0; checked against the model's
            vocabulary later), or None.
        chat_template_kwargs: Keyword arguments of the chat template for ``messages``
            (``add_generation_prompt`` among them when the row sets it), or None.
        questions: The questions the row is asked (its ``questions`` field, else the run's
            set; :mod:`mlxpa.data.questions`), or None: the row is generated.
        gold: Question name to the index of its gold label, for the questions that have one
            (None when the row is asked no question).
    """

    index: int
    id: str | int
    prompt: str | None
    messages: list[dict] | None
    params: dict[str, Any]
    error: str | None = None
    line: int | None = None
    keep: dict[str, Any] | None = None
    openai: str | None = None
    prompt_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    questions: QuestionSet | None = None
    gold: dict[str, int] | None = None


def parse_row(obj: dict[str, Any], index: int, line: int, spec: RowSpec) -> Row:
    """Validate one decoded record (a JSON object or a columnar row; None means absent).

    ``spec.options.system`` goes first: as a ``{"role": "system"}`` message in front of
    ``messages`` (unless they already start with one), or as text and a blank line in front of
    ``prompt``.
    """
    problem = surrogate_problem(obj)
    if problem is not None:  # no string of it reaches a tokenizer, a message or the output
        return bad_record_row(problem, index, line, spec)
    problems: list[str] = []
    fields, prefix, id_field, kind = obj, "", spec.options.id_column, None
    openai = "body" in obj and ("custom_id" in obj or "url" in obj or "method" in obj)
    if openai:  # OpenAI Batch API line
        fields, prefix, id_field = obj.get("body"), "body.", "custom_id"
        kind = check_openai(obj, problems)
        if not isinstance(fields, dict):
            problems.append(field_error_text("body", "an object", fields))
            fields = {}
        check_body_fields(fields, problems)
    else:
        _check_unknown(obj, spec, problems)
    row_id = obj.get(id_field)
    if row_id is None and openai:
        pass  # no custom_id: unknown (an error row with a null custom_id, never the index)
    elif row_id is None:
        row_id = index
    elif isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        problems.append(field_error_text(id_field, "a string or an integer", row_id))
        row_id = index
    ids = None if openai else fields.get(TOKENS)
    if ids is None:
        prompt, messages = _parse_input(fields, prefix, spec, problems)
    else:
        prompt, messages, ids = None, None, _parse_token_ids(fields, spec, problems)
    if kind is None and openai:
        kind = "chat" if messages is not None else "completions"
    if kind is not None and (messages is None) != (kind == "completions") and not problems:
        want = spec.options.messages_column if kind == "chat" else spec.options.prompt_column
        problems.append(f'field "url" {quote_value(obj.get("url"))} needs field "{prefix}{want}"')
    if spec.options.system is not None and ids is not None:
        problems.append('field "prompt_token_ids": --system needs a text prompt or messages')
    elif spec.options.system is not None:
        prompt, messages = _with_system(spec.options.system, prompt, messages)
    template_kwargs = _template_kwargs(fields, prefix, messages is not None, problems)
    params = parse_params(fields, prefix, problems)
    params.update(parse_structured(fields, prefix, problems))
    questions = gold = None
    if not openai:
        questions, gold = parse_questions(fields, spec.options, problems,
                                          token_ids=ids is not None,
                                          constrained="structured_outputs" in params)
    keep = None
    if spec.options.keep_columns:
        keep = {c: obj[c] if c in obj else fields.get(c) for c in spec.options.keep_columns}
    error = f"{where(spec.source, line, spec.unit)}: {'; '.join(problems)}" if problems else None
    return Row(index, row_id, prompt, messages, params, error, line, keep, kind, ids,
               template_kwargs, questions, gold)


def bad_record_row(detail: str, index: int, line: int, spec: RowSpec) -> Row:
    """A row for a record that could not be decoded (invalid JSON, not an object, bad UTF-8,
    a lone surrogate); its id is None (unknown: never the index, which could be another row's
    id)."""
    return Row(index, None, None, None, {}, f"{where(spec.source, line, spec.unit)}: {detail}",
               line)


def _check_unknown(obj: dict, spec: RowSpec, problems: list[str]) -> None:
    """A plain row: unsupported fields (unless at their default) and near misses of
    sampling fields are errors; anything else passes through."""
    for key, value in obj.items():
        if (value is None or key in spec.options.known()
                or key in spec.options.keep_columns):
            continue
        if key in FIELD_SUPPORT:
            problem = field_problem(key, key, value)
            if problem is not None:
                problems.append(problem)
        elif sampling_like(key):
            problems.append(unknown_field(key, key))


TOKENS = PROMPT_FIELDS[0]  # "prompt_token_ids"


def _parse_token_ids(fields: dict, spec: RowSpec, problems: list[str]) -> list[int] | None:
    """The row's ``prompt_token_ids`` (vLLM's TokensPrompt), given instead of a prompt."""
    ids = fields[TOKENS]
    given = [c for c in (spec.options.prompt_column, spec.options.messages_column)
             if fields.get(c) is not None]
    problem = (f'give field "{given[0]}" or field "{TOKENS}", not both' if given
               else token_ids_problem(ids, TOKENS))
    if problem is None:
        return list(ids)
    problems.append(problem)
    return None


def _template_kwargs(fields: dict, prefix: str, chat: bool,
                     problems: list[str]) -> dict[str, Any] | None:
    """``chat_template_kwargs`` with ``add_generation_prompt`` (the kwargs win, as in vLLM),
    or None when the row sets neither; both need ``messages``."""
    kwargs, gen = fields.get("chat_template_kwargs"), fields.get("add_generation_prompt")
    if kwargs is None and gen is None:
        return None
    found = [f for f, v in (("chat_template_kwargs", kwargs), ("add_generation_prompt", gen))
             if v is not None]
    if not chat:
        problems.append(f'field "{prefix}{found[0]}" needs field "{prefix}messages"')
        return None
    if gen is not None and not isinstance(gen, bool):
        problems.append(field_error_text(prefix + "add_generation_prompt", "true or false", gen))
        return None
    problem = template_kwargs_problem(kwargs, prefix + "chat_template_kwargs")
    if problem is not None:
        problems.append(problem)
        return None
    return {**({} if gen is None else {"add_generation_prompt": gen}), **(kwargs or {})}


def _parse_input(fields: dict, prefix: str, spec: RowSpec,
                 problems: list[str]) -> tuple[str | None, list[dict] | None]:
    o = spec.options
    pc, mc = prefix + o.prompt_column, prefix + o.messages_column
    prompt, messages = fields.get(o.prompt_column), fields.get(o.messages_column)
    if prompt is not None and messages is not None:
        problems.append(f'give field "{pc}" or field "{mc}", not both')
        return None, None
    if prompt is None and messages is None:
        if o.prompt_column in fields or o.messages_column in fields:
            null = pc if o.prompt_column in fields else mc
            problems.append(f'field "{null}" is null (and no "{mc if null == pc else pc}")')
        else:
            close = difflib.get_close_matches(pc, list(fields), 1, 0.7) or \
                difflib.get_close_matches(mc, list(fields), 1, 0.7)
            hint = f' (is "{close[0]}" a typo?)' if close else ""
            problems.append(f'missing field "{pc}" (or "{mc}"){hint}')
        return None, None
    if messages is None:
        problem = text_problem(prompt, pc)
        if problem is None:
            return prompt, None
        problems.append(problem)
        return None, None
    clean, problem = parse_messages(messages, mc)
    if problem is not None:
        problems.append(problem)
    return None, clean


def _with_system(system: str, prompt: str | None,
                 messages: list[dict] | None) -> tuple[str | None, list[dict] | None]:
    if messages is not None:
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        return None, messages
    if prompt is not None:
        return f"{system}\n\n{prompt}", None
    return None, None


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
