"""The FastAPI app of ``mlxpa serve``: the OpenAI API as vLLM serves it, on one running
:class:`~mlxpa.engine.async_llm.AsyncLLM`.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (whole, or streamed as
server-sent events), ``POST /v1/annotations`` (mlxpa's: typed questions over one document,
answered as ``mlxpa run --questions`` answers them), ``GET /v1/models``, ``GET /health``
(200 while the engine runs, else 503), ``GET /metrics`` (Prometheus). A body is read by the
request schema every entry point shares before it reaches the engine; its prompt is tokenized
here, by a copy of the model's tokenizer the engine thread never touches.
"""

from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from pydantic.json_schema import models_json_schema

from mlxpa.engine.async_llm import AsyncLLM
from mlxpa.entrypoints.openai import protocol
from mlxpa.entrypoints.openai.asgi import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    ClientGone,
    EventStream,
    until_disconnect,
)
from mlxpa.entrypoints.openai.errors import add_error_handlers, error_response
from mlxpa.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from mlxpa.entrypoints.openai.requests import RequestError, engine_request
from mlxpa.entrypoints.openai.serving import Serving
from mlxpa.inputs import InputProcessor
from mlxpa.sampling_params import SamplingParams
from mlxpa.utils import json_line

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away


@dataclass(frozen=True)
class ServerSettings:
    """What ``mlxpa serve`` sets beside the engine.

    Attributes:
        served_model_name: The model's id in ``/v1/models`` and every response; a request's
            ``model`` must be it (or absent).
        api_key: Every ``/v1`` route needs ``Authorization: Bearer <api_key>`` (None: open).
        max_body_bytes: Larger request bodies get 413.
        allowed_origins: CORS origins allowed (empty: no CORS headers at all).
        chat_template: The chat template's text (``--chat-template``), instead of the
            model's (None: the model's own).
    """

    served_model_name: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    allowed_origins: tuple[str, ...] = ()
    chat_template: str | None = None


def build_app(llm: AsyncLLM, settings: ServerSettings) -> FastAPI:
    """The app serving ``llm`` (started) under ``settings``; its metrics observe ``llm``'s
    finished requests from now on."""
    engine = llm.engine
    tokenizer = copy.deepcopy(engine.tokenizer)  # the front's own: tokenizers keep state
    processor = InputProcessor(tokenizer, engine.runner.vocab_size, engine.max_model_len,
                               chat_template=settings.chat_template)
    # OpenAI's defaults: temperature 1; max_tokens: the rest of the context (as vLLM)
    defaults = SamplingParams(temperature=1.0, max_tokens=engine.max_model_len)
    name = settings.served_model_name
    metrics = ServerMetrics(llm, name)
    llm.on_finished, llm.on_aborted = metrics.on_finished, metrics.on_aborted
    serving = Serving(llm, name, tokenizer)
    created = int(time.time())

    app = FastAPI(title="mlxpa", summary="OpenAI-compatible server on mlxpa's engine",
                  docs_url="/docs", redoc_url=None)
    add_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    if settings.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"])

    @app.get("/health", responses=_responses(None))
    async def health() -> Response:
        if not llm.is_alive:
            return error_response(503, "the engine is not running", code="engine_not_running")
        return Response(status_code=200)

    @app.get("/metrics", responses={200: {"content": {CONTENT_TYPE: {}}}})
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses=_responses("ModelList"))
    async def models() -> Response:
        card = protocol.ModelCard(id=name, created=created, max_model_len=engine.max_model_len)
        return _json(protocol.ModelList(data=[card]).model_dump())

    async def complete(kind: str, request: Request) -> Response:
        request_id = f"{_ID_PREFIX[kind]}-{uuid.uuid4().hex}"
        served = engine_request(kind, await request.body(), request_id, processor, defaults,
                                name)
        try:
            if kind == "annotations":
                outs = await until_disconnect(request, serving.collect(served))
                return _json(serving.annotation(served, outs, request_id))
            if not served.parsed.stream:
                outs = await until_disconnect(request, serving.collect(served))
                return _json(serving.response(served, outs, request_id))
            outputs = llm.generate(served.request)
            first = await until_disconnect(request, anext(outputs))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        if first.error is not None:
            await outputs.aclose()
            raise RequestError(first.error)
        return EventStream(serving.events(served, request_id, first, outputs))

    @app.post("/v1/chat/completions", responses=_responses("ChatCompletionResponse"),
              openapi_extra=_body("ChatCompletionRequest"))
    async def chat_completions(request: Request) -> Response:
        return await complete("chat", request)

    @app.post("/v1/completions", responses=_responses("CompletionResponse"),
              openapi_extra=_body("CompletionRequest"))
    async def completions(request: Request) -> Response:
        return await complete("completions", request)

    @app.post("/v1/annotations", responses=_responses("AnnotationResponse"),
              openapi_extra=_body("AnnotationRequest"))
    async def annotations(request: Request) -> Response:
        return await complete("annotations", request)

    app.openapi = lambda: _openapi(app, name)
    return app


_ID_PREFIX = {"chat": "chatcmpl", "completions": "cmpl", "annotations": "annot"}


def _json(body: dict[str, Any]) -> Response:
    """A JSON response (strict JSON: a non-finite number is null)."""
    return Response(json_line(body), media_type="application/json")


_REF = "#/components/schemas/{model}"
_ERRORS = (400, 401, 404, 413, 503)


def _responses(model: str | None) -> dict[int | str, dict]:
    """The OpenAPI responses of a route: ``model`` for 200 (None: no body), and the error
    object for every error status."""
    error = {"content": {"application/json": {"schema": {
        "$ref": _REF.format(model="ErrorResponse")}}}}
    ok: dict = {"description": "OK"}
    if model is not None:
        ok["content"] = {"application/json": {"schema": {"$ref": _REF.format(model=model)}}}
        if model.startswith(("Chat", "Completion")):
            ok["content"]["text/event-stream"] = {}
    return {200: ok, **{status: {**error, "description": "Error"} for status in _ERRORS}}


def _body(model: str) -> dict:
    """The OpenAPI request body of a route read by the row check (FastAPI never parses it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "$ref": _REF.format(model=model)}}}}}


def _openapi(app: FastAPI, model_name: str) -> dict:
    """FastAPI's schema with the protocol models in ``components``; a request's ``model`` is
    the served model's id."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                             routes=app.routes)
        models = [(getattr(protocol, n), "validation") for n in (
            "ChatCompletionRequest", "CompletionRequest", "AnnotationRequest",
            "ChatCompletionResponse", "CompletionResponse", "AnnotationResponse", "ModelList",
            "ErrorResponse")]
        _, defs = models_json_schema(models, ref_template=_REF)
        for request in ("ChatCompletionRequest", "CompletionRequest", "AnnotationRequest"):
            model = defs["$defs"][request]["properties"]["model"]
            model["anyOf"] = [{"enum": [model_name], "type": "string"}, {"type": "null"}]
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
        app.openapi_schema = schema
    return app.openapi_schema
