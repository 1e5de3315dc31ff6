"""A client that goes away mid-request has its request aborted: its KV blocks go back to the
pool (``mlxpa:kv_blocks_in_use`` and the engine's own count back to the baseline) and the
engine stops generating for it (``vllm:generation_tokens_total`` far below what the request
asked for); the engine keeps serving. Streams and whole responses alike, one client and
twenty at once."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import NAME, running_server

LONG = {"prompt": "a prompt of a few blocks, " * 3, "max_tokens": 3000, "ignore_eos": True,
        "temperature": 0, "model": NAME}


@pytest.fixture(scope="module")
def long_server(folder):
    """A server whose context leaves room for 3,000 output tokens."""
    with running_server(folder, engine={"max_model_len": 4096}) as s:
        yield s


def _stream_then_leave(url: str, chunks: int) -> int:
    """Open a streamed completion, read ``chunks`` events, close the connection; the number
    of text events read."""
    read = 0
    with httpx.Client(timeout=30) as c, c.stream(
            "POST", url + "/v1/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                read += 1
                if read >= chunks:
                    break
    return read


def _check_back_to_baseline(server, before: dict, asked: int) -> None:
    after = server.wait_idle()
    assert after["mlxpa:kv_blocks_in_use"] == 0
    assert after["vllm:num_requests_running"] == 0
    assert server.llm.engine.kv_cache_manager.num_active_blocks == 0
    made = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert made < asked  # stopped early, not run to max_tokens


def _aborted(url: str) -> float:
    """``vllm:request_success_total{finished_reason="abort"}`` (0 before the first)."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:request_success_total{") and 'reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_stream_left_mid_way_is_aborted(long_server):
    server = long_server
    before = server.wait_idle()
    aborted = _aborted(server.url)
    assert before["mlxpa:kv_blocks_in_use"] == 0
    assert _stream_then_leave(server.url, 3) == 3
    _check_back_to_baseline(server, before, LONG["max_tokens"])
    assert _aborted(server.url) == aborted + 1  # counted as vLLM counts it
    r = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=30)
    assert r.json()["usage"]["completion_tokens"] == 4  # still serving


def test_a_whole_response_left_before_it_is_ready_is_aborted(long_server):
    s, body = long_server, json.dumps(LONG).encode()
    before = s.wait_idle()
    host, port = s.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while s.metrics()["vllm:num_requests_running"] == 0:  # running: then leave
            assert time.monotonic() < deadline
            time.sleep(0.01)
    _check_back_to_baseline(s, before, LONG["max_tokens"])


def test_twenty_streams_left_mid_way_leave_the_pool_as_it_was(long_server):
    server = long_server
    before = server.wait_idle()
    threads = [threading.Thread(target=_stream_then_leave, args=(server.url, 2))
               for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _check_back_to_baseline(server, before, 20 * LONG["max_tokens"])
