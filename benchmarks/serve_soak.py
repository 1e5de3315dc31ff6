"""``mlxpa serve`` under a long load: many greedy streaming requests at a fixed concurrency,
counted for failures, compared text by text with ``LLM.generate`` on the same prompts, and
watched for a memory leak (the server's RSS after the first 100 requests against its RSS
after the last).

The prompts are the bench's ``random`` workload sent to ``/v1/completions`` (text prompts, so
both sides tokenize the same string the same way); the server runs first, then the server
stops and ``LLM`` runs the same prompts in this process, so the two never share the CPU.

    python benchmarks/serve_soak.py --num-prompts 1000 --concurrency 32 \\
        --json benchmarks/results/serve_soak.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_systems import mlxpa_serve_argv, served_model
from mlxpa.bench.serve_workloads import synthetic_requests
from mlxpa.bench.server_process import HOST, ServerProcess, free_port, tree_rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the default model)")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--first", type=int, default=100, help="requests before the first RSS reading")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=48)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from mlxpa.loader.models import load_tokenizer_of, resolve_model

    model = str(resolve_model(args.model))
    tokenizer = load_tokenizer_of(model)
    requests = synthetic_requests("random", tokenizer, "completions",
                                  num_prompts=args.num_prompts, input_len=args.input_len,
                                  output_len=args.output_len).requests
    spec = LoadSpec(concurrency=args.concurrency, max_duration_s=3600, request_timeout_s=600)
    port = free_port()
    base = f"http://{HOST}:{port}"
    results = []
    started = time.perf_counter()
    with ServerProcess(mlxpa_serve_argv(model, port), base, start_timeout_s=600) as server:
        name = served_model(base)
        rss_start = tree_rss(server.pid)
        first = drive(base, requests[:args.first], spec, name, ignore_eos=False)
        rss_first = tree_rss(server.pid)
        rest = drive(base, requests[args.first:], spec, name, ignore_eos=False)
        rss_last = tree_rss(server.pid)
    served_s = time.perf_counter() - started
    results = first.results + rest.results
    failed = [r for r in results if not r.success]

    from mlxpa import LLM, SamplingParams

    llm = LLM(model)
    prompts = [r.row["prompt"] for r in requests]
    offline = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=r.max_tokens)
                                     for r in requests])
    by_index = {r.index: r.text for r in results if r.success}
    differ = [i for i, out in enumerate(offline)
              if i in by_index and by_index[i] != out.outputs[0].text]
    report = {
        "requests": len(requests), "concurrency": args.concurrency,
        "input_len": args.input_len, "output_len": args.output_len,
        "sent": len(results), "failed": len(failed),
        "failures": sorted({f"{r.failure}: {r.error[:120]}" for r in failed})[:5],
        "not_sent": first.not_sent + rest.not_sent,
        "served_s": round(served_s, 1),
        "greedy_texts_compared": len(by_index), "greedy_texts_differ": len(differ),
        "differ_first": differ[:10],
        "rss_mib_ready": round(rss_start / 2**20, 1),
        "rss_mib_after_first": round(rss_first / 2**20, 1),
        "rss_mib_after_last": round(rss_last / 2**20, 1),
        "rss_growth_pct": round(100 * (rss_last - rss_first) / rss_first, 2),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(1 if failed or differ else 0)


if __name__ == "__main__":
    main()
