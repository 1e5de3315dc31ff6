"""Every failure as OpenAI's error object (``{"error": {"message", "type", "param",
"code"}}``) with its HTTP status, never a traceback: a refused request (400, from the row
check), a wrong or missing API key (401), an unknown model (404), a body over the limit (413),
a full waiting queue (503 with ``Retry-After``), a stopped engine (503), and anything
unexpected (500, its traceback in the server's log only).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from mlxpa.engine.async_llm import EngineDeadError, QueueFullError
from mlxpa.entrypoints.openai.requests import RequestError

log = logging.getLogger("mlxpa.serve")
RETRY_AFTER_S = 1
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable",
          500: "internal_server_error"}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None,
                   type: str | None = None) -> JSONResponse:
    """OpenAI's error object with ``status``."""
    return JSONResponse({"error": {"message": message,
                                   "type": type or _TYPES.get(status, "invalid_request_error"),
                                   "param": param, "code": code}},
                        status_code=status, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every exception a route raises with :func:`error_response`."""

    @app.exception_handler(RequestError)
    async def _request(request: Request, e: RequestError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.code, type=e.type)

    @app.exception_handler(QueueFullError)
    async def _full(request: Request, e: QueueFullError) -> JSONResponse:
        return error_response(503, str(e), code="queue_full",
                              headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, e: EngineDeadError) -> JSONResponse:
        return error_response(503, str(e), code="engine_not_running")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(400, f"{where or 'request'}: {first.get('msg', 'invalid')}",
                              where, "invalid_request")

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(e).__name__}",
                              code="internal_error")
