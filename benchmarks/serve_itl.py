"""``mlxpa serve`` under arrivals: a streaming row's inter-token latency while a long prompt
arrives, at each step budget (``--max-num-batched-tokens``), and twenty streaming clients that
leave mid-stream (the KV blocks in use go back to the baseline).

    python benchmarks/serve_itl.py --budgets 2048,256 --json benchmarks/results/serve_itl.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from mlxpa.bench.server_process import HOST, ServerProcess, free_port

DECODE = {"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 160,
          "ignore_eos": True, "temperature": 0, "stream": True}


def _stream(base: str, body: dict, times: list[float], leave_after: int | None = None) -> None:
    """Stream ``body``; append each text event's arrival time; leave after so many."""
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
                if leave_after is not None and len(times) >= leave_after:
                    return


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def arrival_itl(base: str, long_words: int, tag: str) -> dict:
    """A row decoding; after 20 of its tokens a long prompt arrives (one output token)."""
    times: list[float] = []
    reader = threading.Thread(target=_stream, args=(base, DECODE, times))
    reader.start()
    while len(times) < 20:
        time.sleep(0.01)
    prompt = f"{tag}: " + " ".join(f"word{i % 97}" for i in range(long_words))
    start = time.perf_counter()
    r = httpx.post(base + "/v1/completions", timeout=600,
                   json={"prompt": prompt, "max_tokens": 1, "temperature": 0}).json()
    end = time.perf_counter()
    reader.join()
    gaps = [(b - a, b) for a, b in zip(times, times[1:])]
    before = [g for g, at in gaps if at < start]
    during = [g for g, at in gaps if start <= at <= end + max(before)]
    return {"long_prompt_tokens": r["usage"]["prompt_tokens"],
            "long_prompt_e2e_s": end - start,
            "itl_before_p50_s": statistics.median(before),
            "itl_during_max_s": max(during), "itl_during_p50_s": statistics.median(during),
            "tokens_during": len(during)}


def leave_mid_stream(base: str, clients: int) -> dict:
    """``clients`` streams at once, each left after two text events."""
    baseline = _metric(base, "mlxpa:kv_blocks_in_use")
    threads = [threading.Thread(target=_stream, args=(base, {**DECODE, "max_tokens": 400},
                                                      [], 2)) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left = time.perf_counter()
    while _metric(base, "vllm:num_requests_running") > 0:
        time.sleep(0.05)
    return {"clients": clients, "kv_blocks_in_use_before": baseline,
            "kv_blocks_in_use_after": _metric(base, "mlxpa:kv_blocks_in_use"),
            "seconds_to_idle": time.perf_counter() - left}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", default="2048,256")
    p.add_argument("--long-words", type=int, default=900, help="words of the long prompt")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = []
    for i, budget in enumerate(int(b) for b in args.budgets.split(",")):
        port = free_port()
        base = f"http://{HOST}:{port}"
        argv = [sys.executable, "-m", "mlxpa", "serve", "--port", str(port),
                "--max-num-batched-tokens", str(budget)]
        with ServerProcess(argv, base, start_timeout_s=600):
            httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       timeout=600)  # warm-up
            row = {"max_num_batched_tokens": budget,
                   **arrival_itl(base, args.long_words, f"run {i}")}
            if i == 0:
                row["leave_mid_stream"] = leave_mid_stream(base, args.clients)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
