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
    assert r.stdout.splitlines()[0].startswith(f"{name} chat c=1: Throughput: ")
    data = json.loads(out.read_text())
    assert set(data) == {"workload", "load", "machine", "systems", "runs", "not_measured"}
    assert [(run["system"], run["endpoint"], run["load"]) for run in data["runs"]] == [
        (name, "chat", "c=1"), (name, "chat", "c=2")]
    for run in data["runs"]:
        assert run["completed"] == 3 and run["output_tokens"] == 9  # DEFAULT: usage 3 each
        assert run["peak_rss_bytes"] > 0 and run["ttft_p99_s"] is not None
        # the fake server counts 7 prompt tokens a request, whatever it is sent
        assert run["prompt_tokens"] == 21 and run["prompt_tokens_counted"] == "usage"
        assert run["workload_prompt_tokens"] != 21 and run["prompt_tokens_per_request"] == 7
    system = data["systems"][name]
    assert system["pid"] == os.getpid() and system["warmup"]["generated_tokens"] == 9
    assert system["blas"] in ("fast", "bundled") and system["model"] == "fake-model"
    # warm-up: one request alone, then 2 at once; then 3 per level; the model of /v1/models
    assert len(server.bodies) == 9 and {b["model"] for b in server.bodies} == {"fake-model"}
    assert all(b["max_tokens"] == 32 and b["ignore_eos"] for b in server.bodies[3:])
    assert png.read_bytes()[:4] == b"\x89PNG"
    text = " ".join(r.output.split())
    assert "the server counted 21 prompt tokens, the workload" in text
    assert "did not read the prompts as the same tokens" in text


def test_shared_prefix_runs_on_chat_and_completions(tokenizer_only, tmp_path):
    out = tmp_path / "s.json"
    with FakeServer() as server:
        r = cli("bench", "serve", "--url", server.url, "--model", tokenizer_only,
                "--prompts-per-group", 3, "--system-prompt-len", 20, "--question-len", 5,
                "--concurrency", "1,3", "--json", out, "-q")
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["workload"]["endpoints"] == ["chat", "completions"]
    assert [(run["endpoint"], run["load"]) for run in data["runs"]] == [
        ("chat", "c=1"), ("chat", "c=3"), ("completions", "c=1"), ("completions", "c=3")]
    warm, timed = server.bodies[:5], server.bodies[5:]
    # warm-up: one request alone, then both endpoints' at once (arriving in any order);
    # then each endpoint and level with prompts of its own
    assert "messages" in warm[0]
    assert sorted("messages" in b for b in warm[1:]) == [False, False, True, True]
    chat, completions = timed[:6], timed[6:]
    assert all("messages" in b for b in chat) and all("prompt" in b for b in completions)
    for b in chat:  # the shared prefix is the system message
        system, user = b["messages"]
        assert system["role"] == "system" and user["role"] == "user"
    prefixes = [b["messages"][0]["content"] for b in chat]
    assert len(set(prefixes[:3])) == 1 and prefixes[0] != prefixes[3]
    for b in completions[:3]:
        assert b["prompt"].startswith(completions[0]["prompt"][:10])
    lines = r.stdout.splitlines()
    assert any(line.startswith(f"{server.url[7:]} completions c=3: Throughput") for line in lines)


def test_endpoint_picks_one(tokenizer_only):
    with FakeServer() as server:
        r = cli("bench", "serve", "--url", server.url, "--model", tokenizer_only,
                "--prompts-per-group", 2, "--system-prompt-len", 10, "--question-len", 4,
                "--concurrency", 1, "--endpoint", "completions", "-q")
    assert r.exit_code == 0, r.output
    assert all("prompt" in b for b in server.bodies) and len(server.bodies) == 5


def test_levels_get_their_own_prompts(tokenizer_only):
    with FakeServer() as server:
        r = cli("bench", "serve", "--url", server.url, "--model", tokenizer_only,
                "--workload", "random", "--num-prompts", 2, "--input-len", 12,
                "--request-rate", "50,100", "--concurrency", 2, "-q", "--no-ignore-eos")
    assert r.exit_code == 0, r.output
    prompts = [b["messages"][0]["content"] for b in server.bodies[3:]]
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
    (["--workload", "file", "--input", "x.jsonl", "--endpoint", "chat"],
     "--endpoint does not apply to --workload file"),
    (["--baselines", "llama-server", "--llama-server", "/no/such/llama-server"],
     "is not an executable file"),
    (["--baselines", "llama-server", "--gguf", "/no/such.gguf",
      "--llama-server", "/bin/true"], "is not a file"),
])
def test_options_are_checked_before_any_work(tokenizer_only, args, message):
    r = cli("bench", "serve", "--model", tokenizer_only, *args)
    assert r.exit_code == 1 and message in r.output, r.output


def test_no_server_measured_exits_1(tokenizer_only):
    r = cli("bench", "serve", "--url", "http://127.0.0.1:9", "--served-model-name", "m",
            "--model", tokenizer_only, "--workload", "random", "--num-prompts", 1,
            "--input-len", 8, "--concurrency", 1, "-q")
    assert r.exit_code == 1
    assert ("not measured: no generated token in the warm-up (1 try"
            in " ".join(r.output.split()))


def test_bench_options_before_serve_are_refused(tokenizer_only):
    r = cli("bench", "--workload", "random", "serve", "--model", tokenizer_only)
    assert r.exit_code == 2 and "--workload before 'serve'" in " ".join(r.output.split())


def test_engine_options_reach_the_mlxpa_server_it_starts(tokenizer_only, monkeypatch):
    """The servers bench serve starts get its engine options: the mlxpa server's command
    carries them, and `mlxpa serve` parses that command back to the same EngineConfig."""
    import typer

    from mlxpa.bench import serve_systems
    from mlxpa.bench.server_process import ServerStartError
    from mlxpa.cli import app
    from mlxpa.cli.options import checked_engine_config

    started: list[list[str]] = []

    class Refused:
        def __init__(self, argv, *args, **kwargs):
            started.append(argv)

        def __enter__(self):
            raise ServerStartError("not started in this test")

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(serve_systems, "ServerProcess", Refused)
    r = cli("bench", "serve", "--model", tokenizer_only, "--workload", "random",
            "--num-prompts", 1, "--input-len", 8, "--concurrency", 1, "--baselines",
            "mlxpa,mlx-lm-server", "--kv-memory", "0.25", "--max-num-seqs", 8,
            "--no-enable-prefix-caching", "--block-size", 32, "-q")
    assert r.exit_code == 1 and "not started in this test" in r.output
    mlxpa_argv, mlx_lm_argv = started
    given = mlxpa_argv[mlxpa_argv.index("serve") + 1:]
    assert given[:6] == ["--model", tokenizer_only, "--host", "127.0.0.1", "--port",
                         given[5]]
    assert given[6:] == ["--block-size", "32", "--kv-memory", "0.25", "--max-num-seqs", "8",
                         "--no-enable-prefix-caching"]
    assert "--kv-memory" not in mlx_lm_argv  # mlx_lm.server has no such budget
    command = typer.main.get_command(app).commands["serve"]
    ctx = command.make_context("serve", given)
    engine = {k: ctx.params[k] for k in ctx.params if k not in (
        "host", "port", "api_key", "served_model_name", "max_num_waiting", "max_body_bytes",
        "allowed_origins", "timeout_graceful_shutdown", "blas", "model_path",
        "chat_template")}
    parsed = checked_engine_config({k: v.value if hasattr(v, "value") else v
                                    for k, v in engine.items()})
    assert parsed.kv_cache_memory_bytes == 2**28 and parsed.max_num_seqs == 8
    assert parsed.block_size == 32 and parsed.enable_prefix_caching is False


def test_the_llama_server_command(tmp_path):
    from mlxpa.bench.llama_server import find_llama_server, llama_server_spec

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    spec = llama_server_spec("/opt/llama-server", str(gguf), slots=16, max_request_tokens=600,
                             threads=2)
    assert spec.name == "llama-server" and spec.ignore_eos and spec.model_name is None
    assert spec.argv("/ignored/folder", 8123) == [
        "/opt/llama-server", "-m", str(gguf), "--host", "127.0.0.1", "--port", "8123",
        "-t", "2", "-np", "16", "-kvu", "-c", "16384", "--cache-reuse", "256",
        "--cache-prompt", "--swa-full", "--metrics"]
    wide = llama_server_spec("/opt/llama-server", str(gguf), slots=32, max_request_tokens=700)
    argv = wide.argv("/m", 1)
    assert argv[argv.index("-c") + 1] == str(32 * 700)
    assert argv[argv.index("-t") + 1] == str(len(os.sched_getaffinity(0)))
    assert find_llama_server("/bin/true") == "/bin/true"
    assert spec.mlx is False  # no MLX BLAS preloaded into it
    templated = llama_server_spec("/opt/llama-server", str(gguf), 2, 100, 2,
                                  chat_template="{{ messages[0]['content'] }}")
    argv = templated.argv("/m", 1)
    assert argv[-3:-1] == ["--jinja", "--chat-template-file"]
    with open(argv[-1]) as f:
        assert f.read() == "{{ messages[0]['content'] }}"
