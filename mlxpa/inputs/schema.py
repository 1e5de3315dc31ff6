"""The request schema: which fields a request has and how they are read, for every entry point
(a file row, an OpenAI Batch body, an HTTP body, an ``LLM`` dict prompt), vLLM's protocol
objects in one function: :func:`parse_request` turns a request's fields into a
:class:`ParsedRequest` (the prompt, the sampling fields it sets, its questions) and lists every
problem, naming the field as the request spells it. Files and HTTP are envelopes around it;
the defaults are merged once, later (:meth:`mlxpa.inputs.InputProcessor.process_inputs`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

from mlxpa.annotation.questions import QuestionSet
from mlxpa.inputs.prompts import (
    TOKENS,
    ChatPrompt,
    PromptType,
    is_token_ids,
    read_prompt,
    read_template_kwargs,
    read_token_ids,
    token_ids_problem,
    with_system,
)
from mlxpa.inputs.question_fields import parse_questions
from mlxpa.inputs.unsupported import FIELD_SUPPORT, field_problem, sampling_like, unknown_field
from mlxpa.messages import field_error_text, surrogate_problem
from mlxpa.request import cache_salt_problem
from mlxpa.sampling_params import REQUEST_FIELDS, CheckedFields, RequestOutputKind
from mlxpa.sampling_params import sampling_field_problem as field_rule
from mlxpa.structured.fields import STRUCTURED_FIELDS, parse_structured

# The sampling fields a request sets by name (SamplingParams' request fields), in order.
SAMPLING_FIELDS = REQUEST_FIELDS
# A request's prompt fields beside its prompt and messages: vLLM's TokensPrompt
# ``prompt_token_ids`` (instead of a text), and with ``messages`` vLLM's chat request fields
# ``chat_template_kwargs`` and ``add_generation_prompt``.
PROMPT_FIELDS = (TOKENS, "chat_template_kwargs", "add_generation_prompt")
# vLLM's prompt encoding field: false encodes a prompt without the tokenizer's special tokens.
ENCODING_FIELDS = ("add_special_tokens",)
# vLLM's prefix-cache namespace: only requests with the same salt share cached blocks.
CACHE_SALT = "cache_salt"
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty")


class RequestSpec(NamedTuple):
    """How one source spells its requests.

    Attributes:
        prompt_field: The field of the text prompt (``--prompt-column``).
        messages_field: The field of the chat messages.
        id_field: The field of a row's id (None: the request has no id field: a body).
        system: A system message put before every prompt (``--system``).
        questions: The question set asked of a row without a ``questions`` field of its own.
        gold_field: The field of a row's gold labels (``--gold-column``).
        keep: Fields the source carries to its output (``--keep-columns``): never refused.
        body: An OpenAI body: every field must be known (a row lets others pass through).
        api: With ``body``, the route: ``chat`` or ``completions`` (None: told by the prompt),
            or ``annotations`` (a document, ``prompt`` or ``messages``, and its
            ``questions``).
        route: How the route is named when a body lacks its prompt field.
        prefix: Put before field names in problems (``"body."`` in an OpenAI Batch line).
        served: An HTTP body: ``stream``, ``stream_options``, a completions ``prompt`` of token
            ids, chat's ``logprobs`` true or false.
    """

    prompt_field: str = "prompt"
    messages_field: str = "messages"
    id_field: str | None = None
    system: str | None = None
    questions: QuestionSet | None = None
    gold_field: str | None = None
    keep: tuple[str, ...] = ()
    body: bool = False
    api: str | None = None
    route: str = "this route"
    prefix: str = ""
    served: bool = False


class ParsedRequest(NamedTuple):
    """A request as :func:`parse_request` read it (what is valid of it when ``problems``).

    Attributes:
        id: Its id field's value (the row index when it has none); None without an id field.
        prompt: The text prompt, or None.
        messages: Chat messages (null keys dropped, text parts joined), or None.
        prompt_token_ids: The prompt as token ids, or None.
        chat_template_kwargs: The chat template's variables (``add_generation_prompt``
            among them when set), or None.
        params: The sampling fields it sets (each checked by its rule), by
            :class:`~mlxpa.sampling_params.SamplingParams` field name.
        questions: The questions it is asked (scored, not decoded), or None.
        gold: Question name to its gold label's index, for the questions that have one.
        api: An OpenAI body's route, ``chat`` or ``completions``; None for a row.
        stream: An HTTP body asks for a stream (its ``params`` then ask ``DELTA`` outputs).
        include_usage: ``stream_options.include_usage``.
        add_special_tokens: vLLM's: False encodes the prompt without the tokenizer's special
            tokens; None: mlxpa's rule (:mod:`mlxpa.inputs.encode`).
        problems: Every problem, each naming its field; empty for a valid request.
        prefix: How its field names start in problems (``"body."``: an OpenAI Batch line).
        cache_salt: vLLM's ``cache_salt`` (its prefix-cache namespace), or None: unsalted.
    """

    id: str | int | None = None
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    params: CheckedFields = CheckedFields()
    questions: QuestionSet | None = None
    gold: dict[str, int] | None = None
    api: str | None = None
    stream: bool = False
    include_usage: bool = False
    add_special_tokens: bool | None = None
    problems: tuple[str, ...] = ()
    prefix: str = ""
    cache_salt: str | None = None

    def prompt_type(self) -> PromptType:
        """The prompt as the input processor takes it: token ids, messages, or text."""
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        if self.messages is not None:
            return ChatPrompt(self.messages, self.chat_template_kwargs)
        return self.prompt


ROW = RequestSpec(id_field="id")  # a row of mlxpa run (an LLM dict prompt) as given


def parse_request(fields: Mapping[str, Any], spec: RequestSpec = ROW, *,
                  index: int = 0, problems: list[str] | None = None) -> ParsedRequest:
    """Read one request's fields (a decoded JSON object; a null is an absent field).

    Args:
        fields: The request's fields.
        spec: How the source spells them.
        index: The row's position (its id when ``spec.id_field`` is absent from it).
        problems: Problems its envelope found first (appended to, in place).

    Returns:
        The request; ``problems`` lists each problem (empty: it is valid). A served body's
        own fields (``stream``, chat's ``logprobs``, a list ``prompt``) are checked first,
        then that every string is Unicode text: a problem there is the only one listed.
    """
    problems = [] if problems is None else problems
    served = _served_fields(fields, spec) if spec.served else None
    if isinstance(served, str):
        return ParsedRequest(params=CheckedFields(), problems=(served,))
    fields = served.fields if served is not None else fields
    text = surrogate_problem(fields, spec.prefix.rstrip("."))
    if text is not None:  # no string of it may reach a tokenizer, a message or the output
        return ParsedRequest(params=CheckedFields(), problems=(*problems, text))
    _check_fields(fields, spec, problems)
    row_id = _request_id(fields, spec, index, problems)
    ids = served.ids if served is not None else (
        None if spec.body else fields.get(TOKENS))
    if ids is None:
        prompt, messages = read_prompt(fields, spec.prompt_field, spec.messages_field,
                                       spec.prefix, problems)
    else:  # token ids instead of a prompt (an HTTP body's were checked with its own fields)
        prompt = messages = None
        if served is None:
            ids = read_token_ids(fields, spec.prompt_field, spec.messages_field, problems)
    api = spec.api or (("chat" if messages is not None else "completions") if spec.body
                       else None)
    if spec.api in ("chat", "completions") and (messages is None) != (api == "completions") \
            and not problems:
        want = spec.messages_field if api == "chat" else spec.prompt_field
        problems.append(f'{spec.route} needs field "{spec.prefix}{want}"')
    if spec.system is not None and ids is not None:
        problems.append('field "prompt_token_ids": --system needs a text prompt or messages')
    elif spec.system is not None:
        prompt, messages = with_system(spec.system, prompt, messages)
    template_kwargs = read_template_kwargs(fields, spec.prefix, messages is not None, problems)
    params = parse_params(fields, spec.prefix, problems)
    params.update(parse_structured(fields, spec.prefix, problems))
    questions = gold = None
    if not spec.body or api == "annotations":
        questions, gold = parse_questions(
            fields, spec.questions, spec.gold_field, problems,
            prompt_fields=f'"{spec.prompt_field}" or "{spec.messages_field}"',
            token_ids=ids is not None, constrained="structured_outputs" in params)
        if questions is None and api == "annotations" and fields.get("questions") is None:
            problems.append('missing field "questions"')
    if served is not None and served.stream:
        params["output_kind"] = RequestOutputKind.DELTA
    add_special_tokens = _add_special_tokens(fields, spec.prefix, problems)
    salt = fields.get(CACHE_SALT)
    problem = cache_salt_problem(salt, spec.prefix + CACHE_SALT)
    if problem is not None:
        problems.append(problem)
        salt = None
    return ParsedRequest(row_id, prompt, messages, ids, template_kwargs, params, questions,
                         gold, api, served is not None and served.stream,
                         served is not None and served.include_usage, add_special_tokens,
                         tuple(problems), spec.prefix, salt)


def parse_params(fields: Mapping[str, Any], prefix: str, problems: list[str]) -> CheckedFields:
    """The sampling fields of ``fields`` in their Python types, each checked by its rule
    (:func:`~mlxpa.sampling_params.sampling_field_problem`), every problem appended naming
    ``prefix + name``. ``max_completion_tokens`` (OpenAI's newer name) wins over
    ``max_tokens`` when both are set, as in vLLM; both are checked."""
    params = CheckedFields()
    for name in (*SAMPLING_FIELDS, "max_completion_tokens"):
        value = fields.get(name)
        if value is None:
            continue
        v = _from_json(name, value)
        wanted = field_rule("max_tokens" if name == "max_completion_tokens" else name, v)
        if wanted is not None:
            problems.append(field_error_text(prefix + name, wanted, value))
            continue
        params[name] = v
    if "max_completion_tokens" in params:
        params["max_tokens"] = params.pop("max_completion_tokens")
    return params


def known_fields(spec: RequestSpec) -> frozenset[str]:
    """The fields with a meaning in a row of ``spec`` (every other field passes through)."""
    return _known(spec)


@functools.lru_cache(maxsize=64)
def _known(spec: RequestSpec) -> frozenset[str]:
    gold = [q.gold_field for q in spec.questions.questions] if spec.questions else []
    return frozenset((spec.prompt_field, spec.messages_field, *PROMPT_FIELDS, *SAMPLING_FIELDS,
                      *STRUCTURED_FIELDS, *ENCODING_FIELDS, CACHE_SALT, "max_completion_tokens",
                      "questions", *(c for c in (spec.id_field, spec.gold_field, *gold) if c)))


def _check_fields(fields: Mapping[str, Any], spec: RequestSpec, problems: list[str]) -> None:
    """Unsupported fields (unless at their default) and, in a body, unknown ones; in a row,
    near misses of sampling fields (anything else passes through)."""
    known = known_fields(spec) if not spec.body else frozenset(
        (spec.prompt_field, spec.messages_field, "max_completion_tokens", *SAMPLING_FIELDS,
         *PROMPT_FIELDS[1:], *ENCODING_FIELDS, CACHE_SALT,
         *(("questions",) if spec.api == "annotations" else ())))
    for key, value in fields.items():
        if value is None or key in known or key in spec.keep:
            continue
        if key in FIELD_SUPPORT:
            problem = field_problem(spec.prefix + key, key, value)
            if problem is not None:
                problems.append(problem)
        elif spec.body or sampling_like(key):
            problems.append(unknown_field(spec.prefix + key, key))


def _request_id(fields: Mapping[str, Any], spec: RequestSpec, index: int,
                problems: list[str]) -> str | int | None:
    """A row's id: its id field (a string or an integer), else its index."""
    if spec.id_field is None:
        return None
    row_id = fields.get(spec.id_field)
    if row_id is None:
        return index
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        problems.append(field_error_text(spec.id_field, "a string or an integer", row_id))
        return index
    return row_id


def _add_special_tokens(fields: Mapping[str, Any], prefix: str,
                        problems: list[str]) -> bool | None:
    value = fields.get("add_special_tokens")
    if value is not None and not isinstance(value, bool):
        problems.append(field_error_text(prefix + "add_special_tokens", "true or false", value))
        return None
    return value


class _Served(NamedTuple):
    fields: dict[str, Any]  # the body without its stream fields (a one-item prompt unwrapped)
    stream: bool
    include_usage: bool
    ids: list[int] | None  # a completions prompt of token ids


def _served_fields(body: Mapping[str, Any], spec: RequestSpec) -> _Served | str:
    """An HTTP body's own fields, or its first problem with them."""
    fields = dict(body)
    stream, options = fields.pop("stream", None), fields.pop("stream_options", None)
    if stream is not None and not isinstance(stream, bool):
        return field_error_text("stream", "true or false", stream)
    usage = options.get("include_usage") if isinstance(options, dict) else None
    if options is not None:
        if not isinstance(options, dict) or not isinstance(usage, (bool, type(None))):
            return field_error_text("stream_options", '{"include_usage": true or false}',
                                    options)
        if not stream:
            return 'field "stream_options" needs "stream": true'
    if spec.api == "chat":
        logprobs = fields.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            return field_error_text("logprobs", "true or false (a chat request; top_logprobs "
                                    "gives the count)", logprobs)
        if fields.get("top_logprobs") is not None and logprobs is not True:
            return 'field "top_logprobs" needs "logprobs": true'
    ids = None
    prompt = fields.get(spec.prompt_field)
    if spec.api == "completions" and isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = fields[spec.prompt_field] = prompt[0]
        if isinstance(prompt, list):
            if prompt and not is_token_ids(prompt) and all(
                    isinstance(p, (str, list)) for p in prompt):
                return (f'field "prompt": {len(prompt)} prompts given; this server takes one '
                        "prompt per request (a string or a list of token ids)")
            problem = token_ids_problem(prompt, "prompt")
            if problem is not None:
                return problem
            ids = list(prompt)
            fields.pop(spec.prompt_field)
    return _Served(fields, bool(stream), bool(usage), ids)


def _from_json(name: str, value: Any) -> Any:
    """``value`` in the field's Python type where JSON's number types differ from it (an
    integral float such as ``10.0`` for an int field, an int for a float field; one
    ``stop`` string or one stop id as a list; ``logit_bias``' keys, strings in JSON, as
    ints where they spell one); anything else unchanged, for the field's rule to judge."""
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
    """A ``logit_bias`` key as an int when it spells a decimal integer; anything else
    unchanged, for the range check to refuse."""
    if isinstance(key, str) and key.isascii() and key.isdecimal() and len(key) <= 20:
        return int(key)
    return _as_int(key)


def _as_int(value: Any) -> Any:
    """An integral float as an int; anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value

