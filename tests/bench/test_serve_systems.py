"""``mlxpa bench serve``'s systems: mlx_lm.server on a tiny model (started with the bench
process's BLAS, driven, stopped; its greedy texts equal to mlx-lm's own ``generate``), the
offline system, a server that cannot start (reported, not raised), readiness and stopping of a
server subprocess."""

from __future__ import annotations

import os
import sys
import textwrap

import psutil
import pytest
from mlx_lm import generate, load

from mlxpa.bench import serve_systems
from mlxpa.bench.serve_figures import token_counter
from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_offline import run_offline
from mlxpa.bench.serve_systems import (
    SERVERS,
    Level,
    ServeBench,
    ServerSpec,
    mlx_lm_server_argv,
)
from mlxpa.bench.serve_workloads import synthetic_requests
from mlxpa.bench.server_process import ServerProcess, ServerStartError, free_port
from tests.tiny_models import STRICT_TEMPLATE, save_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", chat_template=STRICT_TEMPLATE)
    model, tokenizer = load(folder)
    return folder, model, tokenizer


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


def test_mlx_lm_server_answers_the_load_as_mlx_lm_generates(tiny):
    folder, model, tokenizer = tiny
    wl = synthetic_requests("random", tokenizer, num_prompts=3, input_len=30, output_len=10,
                            seed=5)
    port = free_port()
    with ServerProcess(mlx_lm_server_argv(folder, port), f"http://127.0.0.1:{port}",
                       start_timeout_s=120) as server:
        result = drive(server.base_url, wl.requests, LoadSpec(concurrency=1),
                       SERVERS["mlx-lm-server"].model_name, ignore_eos=False)
        pid = server.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    for r, req in zip(result.results, wl.requests):
        ids = tokenizer.apply_chat_template(req.row["messages"], add_generation_prompt=True)
        assert r.success and r.text == generate(model, tokenizer, ids, max_tokens=10)
        assert r.prompt_tokens == len(ids) == req.prompt_len
        assert r.completion_tokens <= 10 and r.ttft_s <= r.e2e_s


def test_mlx_lm_server_system_reports_figures_and_stops(tiny):
    folder, _, tokenizer = tiny
    wl = synthetic_requests("shared-prefix", tokenizer, num_groups=1, prompts_per_group=4,
                            system_prompt_len=40, question_len=8, output_len=6)
    warm = synthetic_requests("shared-prefix", tokenizer, num_groups=1, prompts_per_group=2,
                              system_prompt_len=40, question_len=8, output_len=2, seed=9)
    levels = [Level(LoadSpec(concurrency=c), wl.requests) for c in (1, 4)]
    bench = ServeBench(levels, warm.requests, token_counter(tokenizer))
    bench.run(("mlx-lm-server",), folder, start_timeout_s=120)
    assert bench.failed == {} and [(r.system, r.load) for r in bench.runs] == [
        ("mlx-lm-server", "c=1"), ("mlx-lm-server", "c=4")]
    for run in bench.runs:
        f = run.figures
        assert f["completed"] == 4 and f["failed"] == 0 and f["failures"] == {}
        # mlx_lm.server's usage counts the prompt as mlxpa's chat template rendering does
        assert f["prompt_tokens"] == wl.num_prompt_tokens == f["workload_prompt_tokens"]
        assert f["prompt_tokens_counted"] == "usage"
        assert f["prompt_tokens_per_request"] == wl.num_prompt_tokens / 4
        assert f["output_tokens_counted"] == "usage" and 4 <= f["output_tokens"] <= 24
        assert f["peak_rss_bytes"] > 20 * 2**20
        assert 0 < f["ttft_p50_s"] <= f["e2e_p50_s"] <= f["duration_s"]
    assert _children() == []


def _fast_blas(pid) -> list[str]:
    """OpenBLAS/MKL paths in ``/proc/PID/maps``, read here (not with mlxpa's reader)."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[5] for line in f if len(line.split()) >= 6}
    return sorted(p for p in paths
                  if os.path.basename(p).startswith(("libopenblas", "libmkl_rt")))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_started_server_maps_the_bench_process_blas(tiny, monkeypatch):
    """As from a plain shell: no LD_PRELOAD, the bench process's OpenBLAS loaded by ``import
    mlxpa``. mlx_lm.server, which never imports mlxpa, must still map the same library."""
    ours = _fast_blas("self")
    if not ours:
        pytest.skip("no OpenBLAS/MKL mapped in this process")
    folder, _, tokenizer = tiny
    for name in ("LD_PRELOAD", "MLXPA_BLAS"):
        monkeypatch.delenv(name, raising=False)
    seen: dict[int, list[str]] = {}
    real = serve_systems.process_record

    def spy(pid):
        seen[pid] = _fast_blas(pid)  # the server's own maps, while it runs
        return real(pid)

    monkeypatch.setattr(serve_systems, "process_record", spy)
    wl = synthetic_requests("random", tokenizer, num_prompts=2, input_len=12, output_len=3)
    bench = ServeBench([Level(LoadSpec(concurrency=2), wl.requests, "chat")], wl.requests[:1],
                       token_counter(tokenizer))
    bench.run(("mlx-lm-server",), folder, start_timeout_s=120)
    assert bench.failed == {} and list(seen.values()) == [ours]
    record = bench.systems["mlx-lm-server"]
    assert record["blas"] == "fast" and record["blas_library"] == ours[0]
    assert record["pid"] in seen and record["command"][1:3] == ["-m", "mlx_lm"]
    assert record["warmup"]["generated_tokens"] >= 2
    assert bench.runs[0].figures["completed"] == 2 and bench.runs[0].endpoint == "chat"


def test_offline_system_runs_the_same_requests(tiny):
    folder, _, tokenizer = tiny
    wl = synthetic_requests("random", tokenizer, num_prompts=3, input_len=20, output_len=5)
    f = run_offline(folder, wl.requests, wl.requests[:1], ignore_eos=True,
                    kv_cache_memory_bytes=2**22)
    assert f["completed"] == 3 and f["output_tokens"] == 15  # EOS ignored: all 5 each
    assert f["prompt_tokens"] == wl.num_prompt_tokens
    assert f["output_tokens_per_s"] == pytest.approx(15 / f["duration_s"])
    assert f["ttft_p50_s"] is None and f["itl_p99_s"] is None and f["peak_rss_bytes"] > 0


def test_the_offline_systems_timed_run_finds_its_kv_pool_built(tiny, monkeypatch):
    """A server builds its KV pool before it is ready; the offline system's warm-up does too,
    so the timed run does not pay for growing the pool to the budget (seconds of allocation
    that a short run would count as serving time)."""
    from mlxpa.entrypoints.llm import LLM

    folder, _, tokenizer = tiny
    wl = synthetic_requests("random", tokenizer, num_prompts=3, input_len=20, output_len=5)
    resized: list[int] = []
    real_iter = LLM.generate_iter

    def spy(self, *args, **kwargs):
        engine = self.llm_engine
        before = engine.kv_cache_manager.pool.num_usable_blocks
        out = real_iter(self, *args, **kwargs)  # the pool is fitted at the call
        resized.append(engine.kv_cache_manager.pool.num_usable_blocks != before)
        return out

    monkeypatch.setattr(LLM, "generate_iter", spy)
    f = run_offline(folder, wl.requests, wl.requests[:1], ignore_eos=True,
                    kv_cache_memory_bytes=2**22)
    assert f["completed"] == 3
    assert resized[-1] is False  # the timed call: the pool already at the budget


def test_a_server_that_cannot_start_is_reported_not_raised(tiny):
    folder, _, tokenizer = tiny
    wl = synthetic_requests("random", tokenizer, num_prompts=2, input_len=10, output_len=2)
    broken = ServerSpec("broken", lambda model, port: [
        sys.executable, "-c", "import sys; print('no such model here'); sys.exit(3)"], True)
    bench = ServeBench([Level(LoadSpec(concurrency=1), wl.requests)], [],
                       token_counter(tokenizer))
    bench.run_server(broken, folder, start_timeout_s=30)
    assert bench.runs == []
    assert "exited with code 3" in bench.failed["broken"]
    assert "no such model here" in bench.failed["broken"]
    with pytest.raises(ValueError, match="unknown system"):
        bench.run(("vllm",), folder)


def test_the_mlxpa_entry_starts_mlxpa_serve():
    spec = SERVERS["mlxpa"]
    assert spec.argv("/m", 8123) == [sys.executable, "-m", "mlxpa", "serve", "--model", "/m",
                                     "--host", "127.0.0.1", "--port", "8123"]
    assert spec.ignore_eos and spec.model_name is None and spec.health_path == "/health"


HEALTH_SERVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    time.sleep(float(sys.argv[2]))
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(int(sys.argv[3]) if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_server_process_waits_for_health_then_stops_it():
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port), "0.5", "200"]
    with ServerProcess(argv, f"http://127.0.0.1:{port}", start_timeout_s=60) as server:
        assert server.proc.poll() is None
    assert server.proc.poll() is not None  # stopped by SIGTERM
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port), "0", "503"]
    with pytest.raises(ServerStartError, match="did not answer 200 within 1 s"):
        with ServerProcess(argv, f"http://127.0.0.1:{port}", start_timeout_s=1):
            pass
    assert _children() == []
