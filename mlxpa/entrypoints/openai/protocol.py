"""The OpenAI API's request and response bodies as pydantic models: what the server's OpenAPI
schema (``GET /openapi.json``, ``/docs``) shows. They describe; they do not check: a body is
read by the request schema every entry point shares (:mod:`mlxpa.inputs.schema`), so a field
is refused in the same words over HTTP as in a file. The sampling fields and their ranges are
generated from :class:`~mlxpa.sampling_params.SamplingParams` (its request fields' types and
metadata), so a new field needs no edit here.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from mlxpa.request import MAX_CACHE_SALT_CHARS
from mlxpa.sampling_params import MAX_LOGPROBS, SamplingParams


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    """A request object: a field it does not list is refused (the row check's rule)."""

    model_config = ConfigDict(extra="forbid")


class ContentPart(_Closed):
    type: Literal["text"]
    text: str


class ChatMessage(_Closed):
    role: Literal["system", "developer", "user", "assistant"] = Field(
        description="The model's chat template decides which roles it takes; developer is "
        "read as system (OpenAI's name for it).")
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None


# vLLM's cache_salt: a tenant's secret namespace of the prefix cache (docs/serve.md).
CacheSalt = Annotated[str | None, Field(
    None, min_length=1, max_length=MAX_CACHE_SALT_CHARS,
    description="Only requests with the same salt share prefix-cache blocks (vLLM's field); "
    "keep it secret per tenant.")]


class StreamOptions(_Closed):
    include_usage: bool | None = None


class JsonSchemaFormat(_Closed):
    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Closed):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Closed):
    """vLLM's ``structured_outputs``: exactly one of the fields."""

    choice: list[str] | None = None
    regex: str | None = None
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    grammar: str | None = None
    json_object: bool | None = None


# What the server's defaults are where they differ from SamplingParams' (OpenAI's).
_SERVER_DEFAULTS = {"max_tokens": "Default: the rest of the context.", "temperature": "Default 1."}
_FIELDS = {f.name: f for f in dataclasses.fields(SamplingParams)}
_HINTS = typing.get_type_hints(SamplingParams)


def bounds(name: str) -> dict[str, float]:
    """The range :class:`SamplingParams` states for field ``name`` (``ge``, ``gt``, ``le``)."""
    return dict(_FIELDS[name].metadata.get("bounds", {}))


def _body_type(name: str) -> Any:
    """A request field's type as JSON spells it, its range applied: one value or a list for a
    tuple field, string keys for a map of token ids."""
    kind = _HINTS[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is tuple:
        return args[0] | list[args[0]]
    if dict in (typing.get_origin(a) for a in args) or typing.get_origin(kind) is dict:
        value = Annotated[float, Field(**bounds(name))]
        return dict[Annotated[str, Field(pattern="^[0-9]+$")], value]
    return Annotated[args[0] if typing.get_origin(kind) is not None else kind,
                     Field(**bounds(name))]


_Sampling = create_model(
    "_Sampling", __base__=_Closed, __doc__="The sampling fields both routes take (OpenAI's, "
    "then vLLM's extensions), as SamplingParams states them.",
    model=(str | None, Field(None, description="The served model's id (GET /v1/models).")),
    **{name: (_body_type(name) | None, Field(None, description=_SERVER_DEFAULTS.get(name)))
       for name, f in _FIELDS.items() if f.metadata.get("request")},
    user=(str | None, None), stream=(bool | None, False),
    stream_options=(StreamOptions | None, None),
    response_format=(ResponseFormat | None, None),
    structured_outputs=(StructuredOutputs | None, None),
    add_special_tokens=(bool | None, Field(None, description="False: the prompt is encoded "
                                           "without the tokenizer's special tokens (BOS).")),
    skip_special_tokens=(Literal[False] | None, Field(None, description="mlxpa's text keeps "
                                                      "the special tokens the model writes.")),
    spaces_between_special_tokens=(Literal[False] | None, None),
    cache_salt=(CacheSalt, None),
)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, **bounds("max_tokens"))
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, text or token ids."""

    prompt: (Annotated[str, Field(min_length=1)]
             | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
             | Annotated[list[str], Field(min_length=1, max_length=1)]
             | Annotated[list[list[int]], Field(min_length=1, max_length=1)])
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class AnnotationRequest(_Closed):
    """``POST /v1/annotations`` (mlxpa's): typed questions over one document, each
    question's labels scored (docs/annotation.md); ``prompt`` or ``messages`` is the
    document."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    questions: list[dict[str, Any]] | dict[str, Any] = Field(
        description="A question set: a list of questions, or {preamble, questions}.")
    chat_template_kwargs: dict[str, Any] | None = None
    user: str | None = None
    cache_salt: CacheSalt = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class _Choice(_Open):
    index: int
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    choice_logprobs: dict[str, float] | None = None
    choice_probs: dict[str, float] | None = None
    choice_outside_prob: float | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = None


class ChatChoice(_Choice):
    message: ResponseMessage


class ChatCompletionResponse(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Choice):
    text: str


class CompletionResponse(_Open):
    """A completion; a streamed one sends chunks of this shape."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AnnotationResponse(_Open):
    """The answers about the document, as ``mlxpa run --questions`` writes them: per question
    its label, probs, logprobs, outside_prob, calibrated (false) and, for a scale, expected."""

    id: str
    object: Literal["annotation"]
    created: int
    model: str
    answers: dict[str, dict[str, Any]]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxpa"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object, the body of every 4xx and 5xx answer."""

    error: ErrorInfo
