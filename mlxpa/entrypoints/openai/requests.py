"""A request body to an engine request, through the one row check every entry point shares.

The body becomes the OpenAI Batch line it would be in a file (``{"custom_id", "method":
"POST", "url", "body"}``) and goes through the file run's row parser
(:func:`mlxpa.data.rows.parse_row`: every sampling, constraint and log-probability field,
unknown and unsupported fields), its merge with the server's defaults and the input processor
(:func:`mlxpa.batch.requests.to_request`: the chat template, token ids against the
vocabulary, the prompt against the context), so a body gets exactly what the same line of a
file gets. The server's own fields (``stream``, ``stream_options``) are read here; a
completions ``prompt`` of token ids is checked with the prompt rules of
:mod:`mlxpa.inputs.prompts`. Every problem is a :class:`RequestError` (HTTP 400) naming the
field as the body spells it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, NamedTuple

from mlxpa.batch.requests import to_request
from mlxpa.data import InputOptions
from mlxpa.data.inputs import RowSpec
from mlxpa.data.rows import Row, json_type, parse_row
from mlxpa.data.validate import run_problem
from mlxpa.inputs import InputProcessor
from mlxpa.inputs.prompts import is_token_ids, token_ids_problem
from mlxpa.messages import field_error_text
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import RequestOutputKind, SamplingParams

URLS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_SPEC = RowSpec("request", "row", InputOptions())
_FIELD = re.compile(r'field "([^"]+)"')
_LEADING = re.compile(r"([a-z_]+) must be ")  # a rule between fields: "min_tokens must be <= ..."


class RequestError(ValueError):
    """A request the server refuses: OpenAI's error object's ``message``, ``param``,
    ``type`` and ``code``, and the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = "invalid_request"
                 ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = (
            message, param, status, type, code)


class ParsedRequest(NamedTuple):
    """A checked request body.

    Attributes:
        request: The engine's request (``output_kind`` ``DELTA`` when it streams).
        row: Its row (the file run's record functions read it).
        stream: ``stream: true``.
        include_usage: ``stream_options.include_usage``.
    """

    request: EngineRequest
    row: Row
    stream: bool
    include_usage: bool


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object.

    Raises:
        RequestError: Not UTF-8 JSON, or not an object.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {json_type(body)}")
    return body


def engine_request(kind: str, body: dict[str, Any], request_id: str,
                   processor: InputProcessor, defaults: SamplingParams) -> ParsedRequest:
    """The request of a ``chat`` or ``completions`` body.

    Args:
        kind: ``chat`` or ``completions`` (the route).
        body: The decoded body (not changed).
        request_id: The engine's id for it.
        processor: The model's input processor (vocabulary, context, chat template).
        defaults: Sampling parameters for the fields the body does not set.

    Raises:
        RequestError: Naming the first bad field (every problem in the message).
    """
    fields = dict(body)
    stream, include_usage = _stream_fields(fields)
    if kind == "chat":
        _check_chat_logprobs(fields)
    ids = _prompt_ids(fields) if kind == "completions" else None
    line = {"custom_id": request_id, "method": "POST", "url": URLS[kind], "body": fields}
    row = parse_row(line, 0, None, _SPEC)
    if ids is not None and row.error is None:
        row = dataclasses.replace(row, prompt=None, prompt_token_ids=ids)
    problem = row.error or run_problem(row, defaults, processor.vocab_size)
    if problem is None:
        request = to_request(row, defaults, processor)
        if isinstance(request, str):
            problem = request
    if problem is not None:
        raise _error(problem, kind)
    _check_room(body, request, processor.max_model_len)
    if stream:
        params = dataclasses.replace(request.sampling_params,
                                     output_kind=RequestOutputKind.DELTA)
        request = request._replace(sampling_params=params)
    return ParsedRequest(request, row, stream, include_usage)


def _check_chat_logprobs(fields: dict[str, Any]) -> None:
    """Chat's ``logprobs`` is a boolean and ``top_logprobs`` needs it true (OpenAI's and
    vLLM's chat API; completions' ``logprobs`` is a count).

    Raises:
        RequestError: Either field out of that shape.
    """
    logprobs = fields.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError(field_error_text("logprobs", "true or false (a chat request; "
                                            "top_logprobs gives the count)", logprobs),
                           "logprobs")
    if fields.get("top_logprobs") is not None and logprobs is not True:
        raise RequestError('field "top_logprobs" needs "logprobs": true', "top_logprobs")


def _check_room(body: dict[str, Any], request, max_model_len: int | None) -> None:
    """A ``max_tokens`` (or ``max_completion_tokens``) the body sets must fit in the context
    after the prompt, as vLLM checks it (a default takes the rest of the context).

    Raises:
        RequestError: Prompt and asked tokens over the context.
    """
    field = next((f for f in ("max_completion_tokens", "max_tokens") if body.get(f) is not None),
                 None)
    if field is None or max_model_len is None:
        return
    prompt, asked = len(request.prompt_token_ids), request.sampling_params.max_tokens
    if prompt + asked > max_model_len:
        raise RequestError(f"this model's maximum context length is {max_model_len:,} tokens; "
                           f"you asked for {prompt + asked:,} ({prompt:,} in the prompt, "
                           f"{asked:,} in the completion): lower {field}", field)


def _stream_fields(fields: dict[str, Any]) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage``, taken out of ``fields``."""
    stream = fields.pop("stream", None)
    options = fields.pop("stream_options", None)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(field_error_text("stream", "true or false", stream), "stream")
    if options is None:
        return bool(stream), False
    usage = options.get("include_usage") if isinstance(options, dict) else None
    if not isinstance(options, dict) or not isinstance(usage, (bool, type(None))):
        raise RequestError(field_error_text("stream_options", '{"include_usage": true or '
                                            'false}', options), "stream_options")
    if not stream:
        raise RequestError('field "stream_options" needs "stream": true', "stream_options")
    return True, bool(usage)


def _prompt_ids(fields: dict[str, Any]) -> list[int] | None:
    """A completions ``prompt`` of token ids (one list, or a list holding one prompt);
    ``fields["prompt"]`` is then a stand-in text for the row parser. None for a text prompt
    (unwrapped from a one-item list)."""
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = fields["prompt"] = prompt[0]
    if not isinstance(prompt, list):
        return None
    if prompt and not is_token_ids(prompt) and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"field \"prompt\": {len(prompt)} prompts given; this server takes "
                           "one prompt per request (a string or a list of token ids)", "prompt")
    problem = token_ids_problem(prompt, "prompt")
    if problem is not None:
        raise RequestError(problem, "prompt")
    fields["prompt"] = "token ids"
    return list(prompt)


def _error(problem: str, kind: str) -> RequestError:
    """The :class:`RequestError` of a row problem: without the row's place and the Batch
    line's ``body.`` before field names; its ``param`` the first field it names (the
    prompt's field for a prompt over the context)."""
    message = problem.removeprefix(f"{_SPEC.source}: ")
    message = message.replace('"body.', '"').replace(" body.", " ")
    message = re.sub(r'field "url" "[^"]*" needs ', "this route needs ", message)
    found = _FIELD.search(message) or _LEADING.match(message)
    if found is not None:
        return RequestError(message, found.group(1))
    prompt = message.startswith("prompt has")
    return RequestError(message, ("messages" if kind == "chat" else "prompt") if prompt else None)
