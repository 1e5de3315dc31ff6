"""One streaming request to an OpenAI-compatible server, timed as a streaming client sees it.

The design of vLLM's serving benchmark (``vllm bench serve``): the request goes out with
``stream: true`` and ``stream_options.include_usage``; the server-sent events are read as
they arrive (comment lines such as ``: keepalive`` skipped, ``data: [DONE]`` ends the
stream); each event is timed when it is read. Timing counts only events that carry text
(``delta.content`` of a chat chunk, ``text`` of a completions chunk): the first gives the time
to first token (TTFT), each later one an inter-token latency (ITL), so a role-only opening
chunk or the closing usage chunk never counts as a token. The output token count is the
server's ``usage.completion_tokens`` when it sends one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from mlxpa.bench.serve_workloads import ServeRequest

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

# What a failed request is counted as.
HTTP, CONNECTION, TIMEOUT, STREAM, DEADLINE = "http", "connection", "timeout", "stream", "deadline"


@dataclass
class RequestResult:
    """One request as the client saw it (seconds from ``time.perf_counter``).

    Attributes:
        index: The request's index in its workload.
        sent_at: When the request was sent, seconds after the load started.
        success: The server answered 200 and ended the stream with ``[DONE]``.
        failure: Why not (``http``, ``connection``, ``timeout``, ``stream``, ``deadline``), or
            None.
        error: The failure's detail (HTTP status and the server's message, the exception).
        status: The HTTP status, or None when no response came.
        ttft_s: Seconds from sending to the first event carrying text (None: none came).
        itl_s: Seconds between consecutive events carrying text.
        e2e_s: Seconds from sending to the end of the stream (None: it never ended).
        text: The text received (every choice's, in order of arrival).
        completion_tokens: ``usage.completion_tokens`` of the stream (None: not sent).
        prompt_tokens: ``usage.prompt_tokens`` of the stream (None: not sent).
    """

    index: int
    sent_at: float = 0.0
    success: bool = False
    failure: str | None = None
    error: str = ""
    status: int | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None

    def fail(self, kind: str, error: str) -> None:
        """Mark the request failed (the first failure stays)."""
        if self.failure is None:
            self.success, self.failure, self.error = False, kind, error


def request_body(request: ServeRequest, model: str, ignore_eos: bool) -> dict:
    """The JSON body of ``request``: its fields, ``model``, streaming with usage, and
    ``ignore_eos`` (vLLM's field) when asked for and the row does not set it."""
    body = {"model": model, **request.row, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body.setdefault("ignore_eos", True)
    return body


def _text_of(chunk: dict) -> str:
    """The text a chunk carries over all its choices (chat ``delta.content``, completions
    ``text``)."""
    parts = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            parts.append(text)
    return "".join(parts)


class _Stream:
    """The events of one response, fed line by line (the SSE format: ``data:`` lines up to a
    blank line are one event; lines starting with ``:`` are comments)."""

    def __init__(self, result: RequestResult, started: float,
                 on_text: Callable[[int], None]) -> None:
        self.result, self.started, self.on_text = result, started, on_text
        self.data: list[str] = []
        self.last: float | None = None
        self.done_at: float | None = None

    def line(self, line: str) -> None:
        if not line:
            self.dispatch()
        elif line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))

    def dispatch(self) -> None:
        if not self.data:
            return
        payload, self.data = "\n".join(self.data), []
        if payload.strip() == "[DONE]":
            self.done_at = time.perf_counter()
            return
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            raise _StreamError(f"an event that is not JSON: {payload[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise _StreamError(f"an event that is not an object: {payload[:200]!r}")
        if chunk.get("error") is not None:
            raise _StreamError(f"the server sent an error: {json.dumps(chunk['error'])[:300]}")
        self.chunk(chunk, time.perf_counter())

    def chunk(self, chunk: dict, now: float) -> None:
        r = self.result
        if text := _text_of(chunk):
            if self.last is None:
                r.ttft_s = now - self.started
            else:
                r.itl_s.append(now - self.last)
            self.last = now
            r.text += text
            self.on_text(1)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            r.completion_tokens = usage.get("completion_tokens", r.completion_tokens)
            r.prompt_tokens = usage.get("prompt_tokens", r.prompt_tokens)


class _StreamError(Exception):
    """The stream broke the protocol (an event that is not JSON, an error event)."""


def _ignore(n: int) -> None:
    pass


async def send(client: httpx.AsyncClient, request: ServeRequest, model: str, ignore_eos: bool,
               result: RequestResult, on_text: Callable[[int], None] = _ignore) -> None:
    """Send ``request`` streaming and fill ``result`` as the events arrive (so a caller that
    cancels it on a timeout keeps what was measured). Never raises for the server's or the
    network's faults: they become ``result.failure``.

    Args:
        client: An ``httpx.AsyncClient`` whose ``base_url`` is the server's.
        request: The request; its ``endpoint`` picks the path (:data:`PATHS`).
        model: The ``model`` field to send.
        ignore_eos: Send ``ignore_eos: true`` (for servers that take vLLM's field).
        result: Filled in place.
        on_text: Told 1 for each event carrying text (a progress bar).
    """
    started = time.perf_counter()
    stream = _Stream(result, started, on_text)
    try:
        async with client.stream("POST", PATHS[request.endpoint],
                                 json=request_body(request, model, ignore_eos)) as response:
            result.status = response.status_code
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.fail(HTTP, f"HTTP {response.status_code}: {_message(body)}")
                return
            async for line in response.aiter_lines():
                stream.line(line)
                if stream.done_at is not None:
                    break
            stream.dispatch()
    except _StreamError as e:
        result.fail(STREAM, str(e))
    except httpx.TransportError as e:
        result.fail(CONNECTION, _describe(e))
    except httpx.HTTPError as e:
        result.fail(STREAM, _describe(e))
    if result.failure is None and stream.done_at is None:
        result.fail(STREAM, "the stream ended without data: [DONE]")
    if result.failure is None:
        result.success, result.e2e_s = True, stream.done_at - started


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _message(body: str) -> str:
    """The ``message`` of an OpenAI error object in ``body``, else the body's start."""
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        return body[:300]
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"][:300]
    return str(error)[:300] if error is not None else body[:300]
