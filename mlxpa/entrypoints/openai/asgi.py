"""The server's ASGI pieces around the routes: the API key check of every ``/v1`` route (401),
the request body limit (413), a server-sent event response that stops (and aborts its
request) as soon as the client goes away, and the same for a whole response being computed.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxpa.entrypoints.openai.errors import error_response
from mlxpa.entrypoints.openai.requests import RequestError

T = TypeVar("T")


class ApiKeyMiddleware:
    """Every ``/v1`` route answers 401 unless the request has ``Authorization: Bearer
    <api_key>`` (compared in constant time)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self._want = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._want):
                response = error_response(401, "a valid API key is needed: send the header "
                                          "Authorization: Bearer <key>", code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyTooLarge(RequestError):
    """A request body over the limit (HTTP 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit:,} bytes "
                         "(--max-body-bytes)", status=413, code="request_too_large")


class BodyLimitMiddleware:
    """A request whose body is over ``max_bytes`` gets 413: at once when its
    ``Content-Length`` says so, else when the bytes read pass the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            e = BodyTooLarge(self.max_bytes)
            await error_response(413, e.message, code=e.code)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class EventStream(StreamingResponse):
    """``text/event-stream`` that ends as soon as the client disconnects (its body iterator is
    then closed, which aborts the request) whichever ASGI version the server speaks."""

    def __init__(self, content, **kwargs) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"}, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-send
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelled (which aborts its request) if the client disconnects first.

    Raises:
        ClientGone: The client disconnected.
    """
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            if not t.done():
                t.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone
