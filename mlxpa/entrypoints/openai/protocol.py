"""The OpenAI API's request and response bodies as pydantic models: what the server's OpenAPI
schema (``GET /openapi.json``, ``/docs``) shows. They describe; they do not check: a request
body is checked by the row parser every entry point shares
(:func:`mlxpa.entrypoints.openai.requests.engine_request`), so a field is refused in the same
words over HTTP as in a file, and a field the schema does not list (``tools``, ``echo``) gets
the file run's answer, not a silent drop.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxpa.sampling_params import MAX_LOGPROBS, MAX_N


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    """A request object: a field it does not list is refused (the row check's rule)."""

    model_config = ConfigDict(extra="forbid")


class ContentPart(_Closed):
    type: Literal["text"]
    text: str


class ChatMessage(_Closed):
    role: Literal["system", "user", "assistant"] = Field(
        description="The model's chat template decides which roles it takes.")
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None


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


class _Sampling(_Closed):
    """The sampling fields both routes take (OpenAI's, then vLLM's extensions)."""

    model: str | None = Field(None, description="The served model's id (GET /v1/models).")
    max_tokens: int | None = Field(None, ge=0, description="Default: the rest of the context.")
    temperature: float | None = Field(None, ge=0, description="Default 1.")
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[Annotated[str, Field(pattern="^[0-9]+$")],
                     Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    structured_outputs: StructuredOutputs | None = None


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
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


class ChatDeltaChoice(_Choice):
    delta: dict[str, str]


class ChatCompletionChunk(_Open):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatDeltaChoice]
    usage: Usage | None = None


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
