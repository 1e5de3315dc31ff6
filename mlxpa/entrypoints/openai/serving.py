"""Chat and completion serving: a checked request run on the engine thread
(:class:`~mlxpa.engine.async_llm.AsyncLLM`), answered in OpenAI's shapes
(:mod:`mlxpa.openai_api`, the file run's ``--output-format openai`` bodies too).

A stream is server-sent events: for chat, a role chunk per choice first; then a chunk per
step that gave a choice text or log-probabilities (the engine's ``DELTA`` outputs, so a
choice's chunks joined are its whole text); each choice's last chunk carries its
``finish_reason`` (and a choice row's label probabilities); with
``stream_options.include_usage``, a chunk with ``usage`` and no choices; then ``data:
[DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from mlxpa.annotation.answers import answers_of
from mlxpa.engine.async_llm import AsyncLLM, EngineDeadError
from mlxpa.entrypoints.openai.requests import RequestError, ServerRequest
from mlxpa.openai_api import (
    Tokens,
    chat_logprobs,
    choice_fields,
    completion_body,
    completions_logprobs,
    usage,
    vllm_prompt_logprobs,
)
from mlxpa.request import SampleOutput
from mlxpa.utils import json_line

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    """One server-sent event holding ``obj`` as strict JSON."""
    return f"data: {json_line(obj)}\n\n".encode()


class Serving:
    """Answers checked requests with one model.

    Args:
        llm: The running engine.
        model_name: The ``model`` of every response.
        tokenizer: The model's tokenizer (a token's text and bytes in ``logprobs``).
    """

    def __init__(self, llm: AsyncLLM, model_name: str, tokenizer: Any) -> None:
        self.llm, self.model_name, self.tokens = llm, model_name, Tokens(tokenizer)

    async def collect(self, served: ServerRequest) -> list[SampleOutput]:
        """Every sample's output of a whole (not streamed) request, in sample order."""
        outs = [o async for o in self.llm.generate(served.request)]
        return sorted(outs, key=lambda o: o.sample_index)

    def response(self, served: ServerRequest, outs: list[SampleOutput],
                 request_id: str) -> dict[str, Any]:
        """The response body of finished outputs (:func:`mlxpa.openai_api.completion_body`).

        Raises:
            RequestError: A sample failed (its prompt does not fit the KV pool, its grammar
                failed): the engine's message.
        """
        failed = next((o for o in outs if o.error is not None), None)
        if failed is not None:
            raise RequestError(failed.error)
        return completion_body(outs, served.parsed.api == "chat", self.model_name, request_id,
                               self.tokens)

    def annotation(self, served: ServerRequest, outs: list[SampleOutput],
                   request_id: str) -> dict[str, Any]:
        """The body of an annotated document: ``{"id", "object": "annotation", "created",
        "model", "answers", "usage"}``, its ``answers`` those ``mlxpa run --questions`` writes
        (:func:`mlxpa.annotation.answers.answers_of`; raw, not calibrated).

        Raises:
            RequestError: The document failed (the engine's message).
        """
        (out,) = outs
        if out.error is not None:
            raise RequestError(out.error)
        answers = answers_of(served.parsed.questions, out.question_scores).answers
        return {"id": request_id, "object": "annotation", "created": int(time.time()),
                "model": self.model_name, "answers": answers,
                "usage": usage(out.num_prompt_tokens, 0, out.num_cached_tokens)}

    async def events(self, served: ServerRequest, request_id: str, first: SampleOutput,
                     rest: AsyncIterator[SampleOutput]) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed request whose first output is ``first`` and
        the others come from ``rest`` (closed when this ends, which aborts what still runs).
        """
        stream = _Stream(self, served, request_id)
        try:
            for event in stream.opening():
                yield event
            try:
                async for out in _prepend(first, rest):
                    event = stream.event(out)
                    if event is not None:
                        yield event
                    if out.error is not None:
                        break
                else:
                    if served.parsed.include_usage:
                        yield stream.usage_event()
            except EngineDeadError as e:  # the engine stopped mid-stream: say so, then end
                yield sse({"error": {"message": str(e), "type": "service_unavailable",
                                     "param": None, "code": "engine_not_running"}})
            yield DONE
        finally:
            await rest.aclose()


async def _prepend(first: SampleOutput,
                   rest: AsyncIterator[SampleOutput]) -> AsyncIterator[SampleOutput]:
    yield first
    async for out in rest:
        yield out


class _Stream:
    """The chunks of one streamed request."""

    def __init__(self, serving: Serving, served: ServerRequest, request_id: str) -> None:
        self.s, self.served = serving, served
        self.chat = served.parsed.api == "chat"
        params = served.request.sampling_params
        self.n, self.wants_logprobs = params.n, params.logprobs is not None
        self.head = {"id": request_id,
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(time.time()), "model": serving.model_name}
        self.offsets = [0] * self.n  # completions: text offset of each choice's next token
        self.prompt_tokens = self.cached = self.completion_tokens = 0

    def opening(self) -> list[bytes]:
        """Chat: a chunk per choice giving the assistant role."""
        if not self.chat:
            return []
        return [sse({**self.head, "choices": [{"index": i, "delta": {"role": "assistant",
                                                                     "content": ""},
                                               "logprobs": None, "finish_reason": None}]})
                for i in range(self.n)]

    def event(self, out: SampleOutput) -> bytes | None:
        """The chunk of one output (None when it carries nothing to send); an error event
        for a failed sample."""
        if out.error is not None:
            return sse({"error": {"message": out.error, "type": "invalid_request_error",
                                  "param": None, "code": "invalid_request"}})
        self.prompt_tokens = out.num_prompt_tokens
        self.completion_tokens += len(out.token_ids)
        if out.finished and out.sample_index == 0:
            self.cached = out.num_cached_tokens
        logprobs = out.logprobs if self.wants_logprobs and out.logprobs else None
        if not (out.text or logprobs or out.finished):
            return None
        choice: dict[str, Any] = {"index": out.sample_index}
        if self.chat:
            choice["delta"] = {"content": out.text} if out.text else {}
            choice["logprobs"] = (chat_logprobs(logprobs, self.s.tokens.text,
                                                self.s.tokens.bytes) if logprobs else None)
        else:
            choice["text"] = out.text
            choice["logprobs"] = self._completions_logprobs(out.sample_index, logprobs)
        choice["finish_reason"] = out.finish_reason if out.finished else None
        chunk = {**self.head, "choices": [choice]}
        if out.finished:
            choice.update(choice_fields(out))
            if out.prompt_logprobs is not None and out.sample_index == 0:
                where = chunk if self.chat else choice
                where["prompt_logprobs"] = vllm_prompt_logprobs(out.prompt_logprobs,
                                                                self.s.tokens.text)
        return sse(chunk)

    def _completions_logprobs(self, index: int, logprobs: list | None) -> dict | None:
        """Completions ``logprobs`` of a chunk, its ``text_offset`` counted from the start
        of the choice's text."""
        if not logprobs:
            return None
        lp = completions_logprobs(logprobs, self.s.tokens.text)
        base = self.offsets[index]
        lp["text_offset"] = [base + o for o in lp["text_offset"]]
        self.offsets[index] = base + sum(len(t) for t in lp["tokens"])
        return lp

    def usage_event(self) -> bytes:
        return sse({**self.head, "choices": [], "usage": usage(
            self.prompt_tokens, self.completion_tokens, self.cached)})
