"""What ``mlxpa serve`` refuses, and how: OpenAI's error object (``message``, ``type``,
``param``, ``code``) with 400 for a bad body (the file run's row check: every bad field named,
unknown and unsupported fields, a prompt over the context before any model work), 401
without the API key, 404 for another model, 413 for a body over the limit (with and without
``Content-Length``), 503 with ``Retry-After`` when the waiting queue is full; never a
traceback."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.entrypoints.openai.conftest import NAME, running_server

CHAT = [{"role": "user", "content": "hi"}]


def _post(server, route: str, body, **kwargs) -> httpx.Response:
    kw = {"json": body} if not isinstance(body, (bytes, str)) else {"content": body}
    return httpx.post(f"{server.url}/v1/{route}", timeout=30, **kw, **kwargs)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    return error


BAD = [  # (route, body, param, words every problem's message holds)
    ("completions", {"prompt": "x", "max_tokens": "a", "temperature": -1}, "max_tokens",
     ['"max_tokens" must be an integer', '"temperature" must be a finite number >= 0']),
    ("chat/completions", {"messages": CHAT, "temprature": 0}, "temprature",
     ['did you mean "temperature"']),
    ("chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, "tools",
     ["not supported", "tool calling"]),
    ("completions", {"prompt": "x", "echo": True}, "echo", ["not supported"]),
    ("completions", {"prompt": "x" * 300}, "prompt", ["prompt has", "the limit is 191"]),
    ("chat/completions", {"messages": [{"role": "user", "content": "x" * 300}]}, "messages",
     ["prompt has"]),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 3}, "top_logprobs",
     ['needs "logprobs": true']),
    ("chat/completions", {"messages": CHAT, "logprobs": 5}, "logprobs", ["true or false"]),
    ("completions", {"prompt": "x", "max_tokens": 400}, "max_tokens",
     ["maximum context length is 192 tokens", "400 in the completion", "lower max_tokens"]),
    ("chat/completions", {"messages": CHAT, "max_completion_tokens": 10**12},
     "max_completion_tokens", ["maximum context length is 192 tokens"]),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages",
     ["chat template rejected", "unknown role robot"]),
    ("chat/completions", {"messages": []}, "messages", ["non-empty list"]),
    ("completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}},
     "response_format", ["response_format"]),
    ("completions", {"prompt": "x", "structured_outputs": {"regex": "[a-"}},
     "structured_outputs", ["structured_outputs"]),
    ("completions", {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias",
     ["outside the model's vocabulary"]),
    ("completions", {"prompt": "x", "n": 0, "top_p": 2}, "top_p", ['"n" must be', '"top_p"']),
    ("completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, "min_tokens",
     ["min_tokens must be <= max_tokens"]),
    ("completions", {"prompt": ["a", "b"]}, "prompt", ["2 prompts given"]),
    ("completions", {"prompt": [1, -2]}, "prompt", ["token ids"]),
    ("completions", {"prompt": "x", "stream": "yes"}, "stream", ["true or false"]),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options", ['needs "stream": true']),
    ("completions", {"messages": CHAT}, "prompt", ["this route needs"]),
    ("completions", '{"prompt": "x\\ud800"}', "prompt", ["lone surrogate \\ud800"]),
    ("chat/completions", '{"messages": [{"role": "user", "content": "x", "name": "\\udc00"}]}',
     "messages[0].name", ["not Unicode text"]),
    ("completions", '{"prompt": "x", "structured_outputs": {"choice": ["a", "\\udfff"]}}',
     "structured_outputs.choice[1]", ["not Unicode text"]),
    ("completions", "{not json", None, ["not valid JSON"]),
    ("completions", "[1, 2]", None, ["must be a JSON object, got an array"]),
]


@pytest.mark.parametrize(("route", "body", "param", "words"), BAD,
                         ids=[f"{r}-{i}" for i, (r, *_) in enumerate(BAD)])
def test_bad_body_is_400_naming_the_field(server, route, body, param, words):
    before = server.metrics()["vllm:prompt_tokens_total"]
    error = _error(_post(server, route, body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    for w in words:
        assert w in error["message"], error["message"]
    assert server.metrics()["vllm:prompt_tokens_total"] == before  # no model work


def test_the_openai_client_sees_the_error_object(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=CHAT, temperature=-1)
    assert e.value.status_code == 400
    assert e.value.param == "temperature" and e.value.type == "invalid_request_error"
    assert 'field "temperature" must be a finite number >= 0, got -1' in e.value.message


def test_another_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=2)
    assert e.value.code == "model_not_found" and e.value.param == "model"


def test_unknown_route_is_404_with_the_error_object(server):
    error = _error(httpx.get(server.url + "/v1/nothing", timeout=10), 404)
    assert error["message"] == "Not Found"


def test_api_key_guards_every_v1_route(folder):
    with running_server(folder, api_key="sekret") as s:
        for route in ("/v1/models", "/v1/chat/completions"):
            error = _error(httpx.post(s.url + route, json={"messages": CHAT}, timeout=10)
                           if "chat" in route else httpx.get(s.url + route, timeout=10), 401)
            assert error["code"] == "invalid_api_key"
        _error(httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"},
                         timeout=10), 401)
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong",
                          max_retries=0).models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        r = good.chat.completions.create(model=NAME, messages=CHAT, max_tokens=3)
        assert r.usage.completion_tokens == 3 or r.choices[0].finish_reason == "stop"


def test_body_over_the_limit_is_413(folder):
    body = {"prompt": "x" * 3000, "max_tokens": 1}
    with running_server(folder, max_body_bytes=2000) as s:
        error = _error(_post(s, "completions", body), 413)
        assert error["code"] == "request_too_large" and "2,000 bytes" in error["message"]
        chunks = (b'{"prompt": "' + b"x" * 500 for _ in range(8))  # no Content-Length
        _error(httpx.post(s.url + "/v1/completions", content=chunks, timeout=30), 413)
        assert _post(s, "completions", {"prompt": "x", "max_tokens": 1}).status_code == 200


def test_full_waiting_queue_is_503_with_retry_after(folder):
    results: list[httpx.Response] = []
    body = {"prompt": "x", "max_tokens": 120, "ignore_eos": True, "temperature": 0}
    with running_server(folder, max_num_waiting=1, engine={"max_num_seqs": 1}) as s:
        def ask() -> None:
            results.append(_post(s, "completions", body))

        threads = [threading.Thread(target=ask) for _ in range(6)]
        threads[0].start()  # running (max_num_seqs 1) before the others arrive
        deadline = time.monotonic() + 60
        while s.metrics()["vllm:num_requests_running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(120)
    full = [r for r in results if r.status_code == 503]
    done = [r for r in results if r.status_code == 200]
    # One running, at least one in the queue's one place, the rest turned away.
    assert len(full) + len(done) == 6 and full and len(done) >= 2
    for r in full:
        assert r.headers["retry-after"] == "1"
        assert _error(r, 503)["code"] == "queue_full"
    for r in done:
        assert r.json()["usage"]["completion_tokens"] == 120


def test_cors_is_off_unless_origins_are_given(server, folder):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(server.url + "/v1/completions", headers=preflight, timeout=10)
    assert "access-control-allow-origin" not in r.headers
    with running_server(folder, allowed_origins=("http://app.example",)) as s:
        r = httpx.options(s.url + "/v1/completions", headers=preflight, timeout=10)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.options(s.url + "/v1/completions", timeout=10, headers={
            **preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
