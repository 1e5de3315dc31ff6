"""A request body to an engine request: its bytes decoded and its ``model`` checked, then read
by the request schema every entry point shares (:func:`mlxpa.inputs.schema.parse_request`, as
the HTTP body of its route), the input processor (the server's defaults merged once, token ids
against the vocabulary, the chat template, the context), and the room ``max_tokens`` asks
after the prompt. Every problem is a :class:`RequestError` (HTTP 400) naming the field as the
body spells it.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from mlxpa.inputs import InputProcessor
from mlxpa.inputs.schema import ParsedRequest, RequestSpec, parse_request
from mlxpa.messages import json_type
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams

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


class ServerRequest(NamedTuple):
    """A checked request body.

    Attributes:
        request: The engine's request (``output_kind`` ``DELTA`` when it streams).
        parsed: The body as the request schema read it (``api``, ``stream``,
            ``include_usage``, ``questions``).
    """

    request: EngineRequest
    parsed: ParsedRequest


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


def body_spec(kind: str) -> RequestSpec:
    """How a body of route ``kind`` spells a request: ``chat``, ``completions``, or
    ``annotations`` (a document, ``prompt`` or ``messages``, and its ``questions``: scored,
    answered whole)."""
    return RequestSpec(body=True, api=kind, served=kind != "annotations")


def engine_request(kind: str, raw: bytes, request_id: str, processor: InputProcessor,
                   defaults: SamplingParams, served_model_name: str) -> ServerRequest:
    """The request of a ``chat`` or ``completions`` body (or an ``annotations`` one).

    Args:
        kind: The route: ``chat``, ``completions`` or ``annotations``.
        raw: The body's bytes.
        request_id: The engine's id for it.
        processor: The model's input processor (vocabulary, context, chat template).
        defaults: Sampling parameters for the fields the body does not set.
        served_model_name: The ``model`` a body may name.

    Raises:
        RequestError: Not a JSON object; another model (404); naming the first bad field
            (every problem in the message).
    """
    body = parse_json(raw)
    model = body.get("model")
    if model is not None and model != served_model_name:
        raise RequestError(f"the model {model!r} does not exist; this server serves "
                           f"{served_model_name!r} (GET /v1/models)", "model", 404,
                           "not_found_error", "model_not_found")
    parsed = parse_request(body, body_spec(kind))
    if parsed.problems:
        raise _error("; ".join(parsed.problems), kind)
    try:
        request = processor.process_inputs(request_id, parsed, defaults)
    except ValueError as e:
        raise _error(str(e), kind) from None
    _check_room(body, request, processor.max_model_len)
    return ServerRequest(request, parsed)


def _check_room(body: dict[str, Any], request: EngineRequest, max_model_len: int | None) -> None:
    """A ``max_tokens`` (or ``max_completion_tokens``) the body sets must fit in the context
    after the prompt, as vLLM checks it (a default takes the rest of the context).

    Raises:
        RequestError: Prompt and asked tokens over the context.
    """
    field = next((f for f in ("max_completion_tokens", "max_tokens") if body.get(f) is not None),
                 None)
    if field is None or max_model_len is None or request.questions:
        return
    prompt, asked = len(request.prompt_token_ids), request.sampling_params.max_tokens
    if prompt + asked > max_model_len:
        raise RequestError(f"this model's maximum context length is {max_model_len:,} tokens; "
                           f"you asked for {prompt + asked:,} ({prompt:,} in the prompt, "
                           f"{asked:,} in the completion): lower {field}", field)


def _error(message: str, kind: str) -> RequestError:
    """The :class:`RequestError` of a problem: its ``param`` the first field it names (the
    prompt's field for a prompt over the context)."""
    found = _FIELD.search(message) or _LEADING.match(message)
    if found is not None:
        return RequestError(message, found.group(1))
    prompt = message.startswith("prompt has")
    return RequestError(message, ("messages" if kind == "chat" else "prompt") if prompt else None)
