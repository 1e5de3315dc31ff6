"""The warm-up of ``mlxpa bench serve``: timing starts only after the server has generated a
token (a server that answers 503 while it loads is waited for; one that streams no token is
not measured), checked against the fake server's own clock."""

from __future__ import annotations

import pytest

from mlxpa.bench.serve_load import LoadSpec
from mlxpa.bench.serve_systems import Level, ServeBench
from mlxpa.bench.serve_warmup import WarmupError, warm_up
from mlxpa.bench.serve_workloads import ServeRequest
from tests.bench.fake_openai_server import FakeServer


def _requests(n: int, start: int = 0) -> list[ServeRequest]:
    return [ServeRequest(start + i, "chat", {"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 3}, 4) for i in range(n)]


def test_timing_starts_after_a_generated_token_of_a_loading_server():
    with FakeServer(loading_s=1.5) as server:
        bench = ServeBench([Level(LoadSpec(concurrency=2), _requests(4, 10))], _requests(2),
                           lambda text: len(text))
        bench.drive("fake", server.url, "fake-model", True, None, warmup_timeout_s=30)
        received = [t for t, _ in server.timings]
        writes = [w for _, ws in server.timings for w in ws]
    assert bench.failed == {}
    warm = bench.systems["fake"]["warmup"]
    assert warm["attempts"] >= 2 and warm["requests"] == 3 and warm["generated_tokens"] == 9
    # the 503s came first, then one token-bearing warm-up; only then the timed requests
    timed = received[-4:]
    first_token = min(writes)
    assert first_token >= server.loaded_at and min(timed) > first_token
    assert len(received) == warm["attempts"] + 2 + 4
    assert bench.runs[0].figures["completed"] == 4 and bench.runs[0].figures["failed"] == 0


def test_a_server_that_generates_no_token_is_not_measured():
    empty = {"chunks": [], "delays": [], "usage": 0}
    with FakeServer(default=empty) as server:
        bench = ServeBench([Level(LoadSpec(concurrency=1), _requests(2, 10))], _requests(2),
                           lambda text: len(text))
        bench.drive("fake", server.url, "fake-model", True, None, warmup_timeout_s=30)
        sent = len(server.bodies)
    assert bench.runs == [] and "no generated token in the warm-up (1 try" in bench.failed[
        "fake"]
    assert sent == 1  # only a loading server's 503 is tried again


def test_a_server_still_loading_at_the_deadline_is_not_measured():
    with FakeServer(loading_s=60) as server:
        bench = ServeBench([Level(LoadSpec(concurrency=1), _requests(2, 10))], _requests(2),
                           lambda text: len(text))
        bench.drive("fake", server.url, "fake-model", True, None, warmup_timeout_s=2.5)
        sent = len(server.bodies)
    assert bench.runs == [] and "HTTP 503: Loading model" in bench.failed["fake"]
    assert 2 <= sent <= 4  # tried again about once a second, then given up


def test_every_warm_up_request_must_generate():
    with FakeServer() as server:
        requests = _requests(1) + [ServeRequest(1, "chat", {"messages": [
            {"role": "user", "content": '{"chunks": [], "delays": [], "usage": 0}'}],
            "max_tokens": 3}, 4)]
        with pytest.raises(WarmupError, match="generated nothing"):
            warm_up(server.url, requests, "fake-model", True, timeout_s=10)
