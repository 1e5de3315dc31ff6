"""The load generator of ``mlxpa bench serve`` against a scripted server (known chunks at
known delays): TTFT, ITL, end-to-end latency and their percentiles against hand-computed
values, failures by kind, the concurrency cap, Poisson arrivals and the deadline."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from mlxpa.bench.serve_client import request_body
from mlxpa.bench.serve_figures import load_figures
from mlxpa.bench.serve_load import LoadSpec, arrival_times, drive
from mlxpa.bench.serve_workloads import ServeRequest
from tests.bench.fake_openai_server import FakeServer

SLACK = 0.15  # seconds a busy machine may add to a scripted delay (never less than it)


def _requests(scripts: list[dict], endpoint: str = "chat") -> list[ServeRequest]:
    out = []
    for i, s in enumerate(scripts):
        text = json.dumps(s)
        fields = ({"messages": [{"role": "user", "content": text}]} if endpoint == "chat"
                  else {"prompt": text})
        out.append(ServeRequest(i, endpoint, {**fields, "max_tokens": 8, "temperature": 0.0},
                                prompt_len=100 + i))
    return out


def _percentile(values: list[float], q: float) -> float:
    """The definition, written out: linear interpolation between the closest ranks."""
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (rank - lo) * (v[hi] - v[lo])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_latencies_and_percentiles_match_the_scripted_delays(endpoint):
    """Each latency against the server's own record of when it got the request and wrote
    each chunk (the same clock: the server runs in this process), so a busy machine's late
    wake-ups on the server side move the oracle too; the client may add only transport."""
    scripts = [{"chunks": ["a", "b", "c"], "delays": [0.20, 0.10, 0.30], "usage": 3},
               {"chunks": ["ab", "c", "d"], "delays": [0.30, 0.05, 0.05]},  # no usage
               {"chunks": ["x", "y", "z"], "delays": [0.10, 0.20, 0.20], "usage": 5}]
    requests = _requests(scripts, endpoint)
    with FakeServer() as server:
        load = drive(server.url, requests, LoadSpec(concurrency=1), "m", ignore_eos=True)
    r = load.results
    assert [x.success for x in r] == [True] * 3 and load.not_sent == 0
    expected: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": []}
    for x, s, (received, writes) in zip(r, scripts, server.timings):
        assert len(writes) == 3 and writes[0] - received >= s["delays"][0] - 1e-3
        ttft, gaps, e2e = writes[0] - received, np.diff(writes).tolist(), writes[-1] - received
        # the role chunk and the keepalive comment, sent at once, do not count as a token
        assert ttft - 1e-3 <= x.ttft_s <= ttft + SLACK
        assert len(x.itl_s) == 2 and all(abs(m - e) <= SLACK for m, e in zip(x.itl_s, gaps))
        assert e2e - 1e-3 <= x.e2e_s <= e2e + SLACK
        assert x.text == "".join(s["chunks"])
        expected["ttft"].append(ttft)
        expected["itl"] += gaps
        expected["e2e"].append(e2e)
    f = load_figures(load, requests, count_tokens=len)  # one token per character here
    for name, values in expected.items():
        for q in (50, 90, 99):
            want = _percentile(values, q)
            assert want - SLACK <= f[f"{name}_p{q}_s"] <= want + SLACK, (name, q)
    # the server cannot write before its script says, so neither can be below the script's
    # delays, whose percentiles are, by hand: TTFT [0.1, 0.2, 0.3] -> 0.2, 0.28, 0.298;
    # ITL [0.05, 0.05, 0.1, 0.2, 0.2, 0.3] -> 0.15, 0.25, 0.295; E2E [0.4, 0.5, 0.6] -> 0.5,
    # 0.58, 0.598
    for name, nominal in (("ttft", (0.2, 0.28, 0.298)), ("itl", (0.15, 0.25, 0.295)),
                          ("e2e", (0.5, 0.58, 0.598))):
        for q, low in zip((50, 90, 99), nominal):
            assert _percentile(expected[name], q) >= low - 2e-3, (name, q)
            assert f[f"{name}_p{q}_s"] >= low - SLACK, (name, q)
    assert f["output_tokens"] == 3 + 4 + 5  # usage, the text's 4 characters, usage
    assert f["output_tokens_counted"] == "usage+tokenizer"
    assert f["prompt_tokens"] == 7 + 101 + 7  # usage.prompt_tokens, else the workload's
    assert f["completed"] == 3 and f["failed"] == 0 and f["failures"] == {}
    assert f["output_tokens_per_s"] == pytest.approx(12 / f["duration_s"])
    assert f["total_tokens_per_s"] == pytest.approx((115 + 12) / f["duration_s"])
    assert f["requests_per_s"] == pytest.approx(3 / f["duration_s"])
    assert f["duration_s"] >= 1.5 - 1e-3  # one request after the other
    body = server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and body["model"] == "m"


def test_failures_are_counted_by_kind():
    ok = {"chunks": ["a"], "delays": [0.0], "usage": 1}
    scripts = [{"status": 500}, {"chunks": ["a", "b", "c"], "delays": [0, 0, 0],
                                 "reset_after": 1},
               {"hang": 3.0, "chunks": ["a"], "delays": [0]},
               {"chunks": ["a"], "delays": [0], "no_done": True},
               {"error_event": True}, ok]
    requests = _requests(scripts)
    with FakeServer() as server:
        load = drive(server.url, requests, LoadSpec(concurrency=6, request_timeout_s=0.6),
                     "m", ignore_eos=False)
    kinds = [x.failure for x in load.results]
    assert kinds == ["http", "connection", "timeout", "stream", "stream", None]
    assert load.results[0].status == 500 and "scripted failure" in load.results[0].error
    assert "scripted error event" in load.results[4].error
    assert "[DONE]" in load.results[3].error
    f = load_figures(load, requests, count_tokens=len)
    assert f["failures"] == {"http": 1, "connection": 1, "timeout": 1, "stream": 2}
    assert f["completed"] == 1 and f["failed"] == 5 and f["output_tokens"] == 1
    assert "ignore_eos" not in server.bodies[0]


def test_the_concurrency_caps_requests_in_flight():
    requests = _requests([{"chunks": ["a"], "delays": [0.3], "usage": 1}] * 6)
    with FakeServer() as server:
        load = drive(server.url, requests, LoadSpec(concurrency=2), "m", ignore_eos=True)
    assert server.max_in_flight == 2
    assert all(x.success for x in load.results)
    assert 0.9 - 1e-3 <= load.duration_s <= 0.9 + 3 * SLACK  # three rounds of two
    # admitted in order: request 2k and 2k+1 go out together, a round after the ones before
    starts = [x.sent_at for x in load.results]
    for k in (2, 4):
        assert starts[k] >= starts[k - 2] + 0.3 - 1e-3


def test_poisson_arrivals_follow_the_seed():
    rate, seed = 4.0, 3
    gaps = np.random.default_rng(seed).exponential(1 / rate, size=5)
    expected = [0.0, *np.cumsum(gaps[1:])]  # the first request at 0
    assert np.allclose(arrival_times(5, rate, seed), expected)
    assert not np.allclose(arrival_times(5, rate, seed + 1), expected)
    requests = _requests([{"chunks": ["a"], "delays": [0.0], "usage": 1}] * 5)
    with FakeServer() as server:
        load = drive(server.url, requests, LoadSpec(request_rate=rate, seed=seed), "m", True)
    for x, t in zip(load.results, expected):
        assert t - 1e-3 <= x.sent_at <= t + SLACK
    assert LoadSpec(request_rate=rate, concurrency=4).label == "rate=4/s c=4"


def test_the_deadline_bounds_the_load():
    requests = _requests([{"hang": 5.0, "chunks": ["a"], "delays": [0]}] * 4)
    with FakeServer() as server:
        t0 = time.perf_counter()
        load = drive(server.url, requests, LoadSpec(concurrency=2, max_duration_s=0.5), "m",
                     True)
        took = time.perf_counter() - t0
    assert took < 2.0
    assert load.not_sent == 2 and [x.failure for x in load.results] == ["deadline"] * 2
    f = load_figures(load, requests, count_tokens=len)
    assert f["failures"] == {"deadline": 2} and f["not_sent"] == 2 and f["ttft_p50_s"] is None


def test_request_body_keeps_the_rows_fields():
    req = ServeRequest(0, "chat", {"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 4, "temperature": 0.5, "ignore_eos": False},
                       prompt_len=3)
    body = request_body(req, "m", ignore_eos=True)
    assert body["ignore_eos"] is False and body["temperature"] == 0.5 and body["max_tokens"] == 4
    with pytest.raises(ValueError, match="concurrency"):
        LoadSpec(concurrency=0)
    with pytest.raises(ValueError, match="give a concurrency"):
        LoadSpec()
