"""``mlxpa serve`` with a KV pool that follows the load (the default: one segment at start,
grown by segments as requests need blocks, given back ``--kv-release-after`` seconds after the
last step) against the same server with the smallest pool and with the pool preallocated.

Part ``rss``: the resident memory of each server's process tree (RSS, psutil: MLX's buffer
cache and the allocator's free lists included) after one small request ("start"), at the end
of a c16 load (the serve bench's shared-prefix chat workload: 48 requests, a 512-token system
prompt, 32-token questions, 32 output tokens), and 60 s after it; the growing server's
``/metrics`` pool gauges at each point. The smallest pool (``--kv-cache-memory-bytes
2000000``: 20 blocks of the default model in float32, what one short request needs in its 6
KV cache groups) cannot serve the load: it is the server without KV memory, read after the
same small request and again 60 s later.

Part ``timing`` (on a quiet machine): c16 output tok/s of the growing pool against the pool
preallocated at the budget (``--kv-segment-bytes 0``, the server's old behaviour), each
server started afresh, in alternating order, ``--repeats`` times; and, in the ``rss`` run,
the TTFT of the workload's first request on the grown pool right after the load and again
after the pool was given back.

The issue's targets: RSS at start and 60 s after the load at most 1.15x the smallest pool's;
output tok/s within 3 % of the preallocated pool's.

    python benchmarks/kv_pool_rss.py --parts rss --json benchmarks/results/kv_pool_rss.json
    python benchmarks/kv_pool_rss.py --parts rss,timing --repeats 3 --json kv_pool_timing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from mlxpa.bench.serve_figures import load_figures
from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_systems import mlxpa_serve_argv, served_model
from mlxpa.bench.serve_workloads import synthetic_requests
from mlxpa.bench.server_process import HOST, ServerProcess, free_port, tree_rss

MIB = 2**20
POOL_GAUGES = ("mlxpa:kv_pool_blocks", "mlxpa:kv_pool_bytes", "mlxpa:kv_pool_ceiling_bytes",
               "mlxpa:kv_pool_growths_total", "mlxpa:kv_pool_releases_total",
               "mlxpa:kv_blocks_in_use")


def pool_gauges(base: str) -> dict[str, float]:
    """The KV pool's gauges of ``GET /metrics`` (the first sample of each)."""
    values: dict[str, float] = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values.setdefault(name.split("{", 1)[0], float(value))
    return {k: values[k] for k in POOL_GAUGES if k in values}


def small_request(base: str, name: str) -> None:
    """One short completion (3 tokens): it fits the smallest pool."""
    r = httpx.post(base + "/v1/completions", timeout=300, json={
        "model": name, "prompt": "Hi", "max_tokens": 2, "temperature": 0})
    r.raise_for_status()


def ttft(base: str, name: str, request) -> float | None:
    return drive(base, [request], LoadSpec(concurrency=1), name, ignore_eos=True).results[0].ttft_s


def rss_part(model: str, requests, count_tokens, wait_s: float, timing: bool) -> dict:
    spec = LoadSpec(concurrency=16, max_duration_s=3600, request_timeout_s=1800)
    out: dict = {}
    for system, extra in (("smallest", ["--kv-cache-memory-bytes", "2000000"]), ("growing", [])):
        port = free_port()
        base = f"http://{HOST}:{port}"
        with ServerProcess(mlxpa_serve_argv(model, port) + extra, base,
                           start_timeout_s=900) as server:
            name = served_model(base)
            small_request(base, name)
            figures = {"rss_mib_start": tree_rss(server.pid) / MIB}
            if system == "growing":
                figures["pool_start"] = pool_gauges(base)
                load = drive(base, requests, spec, name, ignore_eos=True)
                figures["rss_mib_after_load"] = tree_rss(server.pid) / MIB
                figures["pool_after_load"] = pool_gauges(base)
                figures["load"] = {k: v for k, v in load_figures(
                    load, requests, count_tokens).items() if not isinstance(v, (list, dict))}
                if timing:
                    figures["ttft_s_grown"] = ttft(base, name, requests[0])
            time.sleep(wait_s)
            figures[f"rss_mib_{wait_s:g}s_after"] = tree_rss(server.pid) / MIB
            if system == "growing":
                figures[f"pool_{wait_s:g}s_after"] = pool_gauges(base)
                if timing:
                    figures["ttft_s_after_release"] = ttft(base, name, requests[0])
        out[system] = figures
        print(system, json.dumps(figures), flush=True)
    small, grow = out["smallest"], out["growing"]
    out["ratios"] = {"start": grow["rss_mib_start"] / small["rss_mib_start"],
                     "after": grow[f"rss_mib_{wait_s:g}s_after"] / small["rss_mib_start"],
                     "target": 1.15}
    return out


def timing_part(model: str, requests, count_tokens, repeats: int) -> dict:
    spec = LoadSpec(concurrency=16, max_duration_s=3600, request_timeout_s=1800)
    systems = {"growing": [], "preallocated": ["--kv-segment-bytes", "0"]}
    runs: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(repeats):
        order = list(systems) if r % 2 == 0 else list(reversed(systems))
        for system in order:
            port = free_port()
            base = f"http://{HOST}:{port}"
            with ServerProcess(mlxpa_serve_argv(model, port) + systems[system], base,
                               start_timeout_s=900):
                name = served_model(base)
                drive(base, requests[:1], LoadSpec(concurrency=1), name, ignore_eos=True)
                load = drive(base, requests, spec, name, ignore_eos=True)
            tok_s = load_figures(load, requests, count_tokens)["output_tokens_per_s"]
            runs[system].append(tok_s)
            print(system, f"repeat {r}: {tok_s:.2f} output tok/s", flush=True)
    medians = {s: statistics.median(v) for s, v in runs.items()}
    return {"output_tokens_per_s": runs, "medians": medians,
            "growing_over_preallocated": medians["growing"] / medians["preallocated"],
            "target": 0.97}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the default model)")
    p.add_argument("--parts", default="rss", help="rss, timing, or both (comma-separated)")
    p.add_argument("--prompts", type=int, default=48, help="requests of the c16 load")
    p.add_argument("--wait", type=float, default=60.0, help="seconds after the load")
    p.add_argument("--repeats", type=int, default=2, help="timing: runs per server")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = {s.strip() for s in args.parts.split(",")}

    from mlxpa.loader.models import load_tokenizer_of, resolve_model

    model = str(resolve_model(args.model))
    tokenizer = load_tokenizer_of(model)
    requests = synthetic_requests("shared-prefix", tokenizer, "chat", num_groups=1,
                                  prompts_per_group=args.prompts, system_prompt_len=512,
                                  question_len=32, output_len=32).requests

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    report: dict = {"model": model, "requests": len(requests), "concurrency": 16}
    if "rss" in parts:
        report["rss"] = rss_part(model, requests, count_tokens, args.wait, "timing" in parts)
    if "timing" in parts:
        report["timing"] = timing_part(model, requests, count_tokens, args.repeats)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
