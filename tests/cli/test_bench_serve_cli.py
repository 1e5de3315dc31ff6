"""``mlxpa bench serve``: a running server driven with ``--url`` (JSON, plot, throughput
lines), its option checks before any work, and ``mlxpa bench``'s own options kept apart."""

from __future__ import annotations

import json
import os

import pytest

from tests.bench.fake_openai_server import FakeServer
from tests.cli.helpers import cli


def test_url_run_writes_json_plot_and_throughput_lines(tokenizer_only, tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    with FakeServer() as server:
        r = cli("bench", "serve", "--url", server.url, "--model", tokenizer_only,
                "--workload", "random", "--num-prompts", 3, "--input-len", 12,
                "--concurrency", "1,2", "--server-pid", os.getpid(), "--json", out,
                "--plot", png, "-q")
    assert r.exit_code == 0, r.output
    name = server.url.removeprefix("http://")
    assert r.stdout.splitlines()[0].startswith(f"{name} c=1: Throughput: ")
    data = json.loads(out.read_text())
    assert set(data) == {"workload", "load", "machine", "runs", "not_measured"}
    assert [(run["system"], run["load"]) for run in data["runs"]] == [(name, "c=1"),
                                                                       (name, "c=2")]
    for run in data["runs"]:
        assert run["completed"] == 3 and run["output_tokens"] == 9  # DEFAULT: usage 3 each
        assert run["peak_rss_bytes"] > 0 and run["ttft_p99_s"] is not None
    # 2 warm-up requests, then 3 per level; the model named by GET /v1/models
    assert len(server.bodies) == 8 and {b["model"] for b in server.bodies} == {"fake-model"}
    assert all(b["max_tokens"] == 32 and b["ignore_eos"] for b in server.bodies[2:])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_levels_get_their_own_prompts(tokenizer_only):
    with FakeServer() as server:
        r = cli("bench", "serve", "--url", server.url, "--model", tokenizer_only,
                "--workload", "random", "--num-prompts", 2, "--input-len", 12,
                "--request-rate", "50,100", "--concurrency", 2, "-q", "--no-ignore-eos")
    assert r.exit_code == 0, r.output
    prompts = [b["messages"][0]["content"] for b in server.bodies[2:]]
    assert prompts[:2] != prompts[2:] and len(set(prompts)) == 4
    assert "rate=50/s c=2" in r.stdout and "rate=100/s c=2" in r.stdout
    assert not any("ignore_eos" in b for b in server.bodies)


@pytest.mark.parametrize("args,message", [
    (["--url", "http://127.0.0.1:9", "--baselines", "mlxpa"], "not both"),
    (["--baselines", "mlxpa,vllm"], "unknown system(s) ['vllm']"),
    (["--workload", "file"], "--workload file needs --input"),
    (["--concurrency", "1,x"], "--concurrency takes positive numbers"),
    (["--request-rate", "2", "--concurrency", "1,8"], "one cap, not a list"),
    (["--url", "127.0.0.1:8000"], "must start with http://"),
])
def test_options_are_checked_before_any_work(tokenizer_only, args, message):
    r = cli("bench", "serve", "--model", tokenizer_only, *args)
    assert r.exit_code == 1 and message in r.output, r.output


def test_no_server_measured_exits_1(tokenizer_only):
    r = cli("bench", "serve", "--url", "http://127.0.0.1:9", "--served-model-name", "m",
            "--model", tokenizer_only, "--workload", "random", "--num-prompts", 1,
            "--input-len", 8, "--concurrency", 1, "-q")
    assert r.exit_code == 1
    assert "every warm-up request failed: ConnectError" in " ".join(r.output.split())


def test_bench_options_before_serve_are_refused(tokenizer_only):
    r = cli("bench", "--workload", "random", "serve", "--model", tokenizer_only)
    assert r.exit_code == 2 and "--workload before 'serve'" in " ".join(r.output.split())
