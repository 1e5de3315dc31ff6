"""Where prefix caching costs on a small shared-prefix workload.

Runs the same workload through the engine in one process, alternating variants so machine
noise hits all of them alike, and prints per variant the medians over repeats of: total
time, steps, prefill tokens computed, time in steps that prefill, TTFT p50.

Variants: ``prefix`` (default engine), ``prefix-nodefer`` (prefix caching on, but a request
whose shared prefix another running request is still prefilling is admitted at once and
computes that prefix itself, instead of waiting a step for the cache), ``noprefix``.

    python benchmarks/prefix_small.py                          # 1 group x 8, 128-token prefix
    python benchmarks/prefix_small.py --groups 8 --per-group 16 --system 512 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from mlxpa.bench.workloads import shared_prefix_workload
from mlxpa.config import EngineConfig
from mlxpa.core.prefix_order import prefix_order
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams


def run_once(model, tok, prompts, output_len, variant):
    config = EngineConfig(enable_prefix_caching=variant != "noprefix", kv_cache_memory_bytes=2**30)
    engine = LLMEngine(config, model, tok)
    if variant == "prefix-nodefer":
        engine.scheduler._shares_uncached_prefix = lambda req, n: False
    order = prefix_order(prompts, config.block_size) if variant != "noprefix" else range(
        len(prompts))
    t0 = time.perf_counter()
    engine.counters.start_time = t0
    for i in order:
        engine.add_request(str(i), prompts[i], SamplingParams(max_tokens=output_len,
                                                         ignore_eos=True))
    steps, prefill_time = 0, 0.0
    sched = engine.scheduler
    while engine.has_unfinished_requests():
        prefilling = bool(sched.waiting) or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in sched.running)
        s0 = time.perf_counter()
        engine.step()
        steps += 1
        if prefilling:
            prefill_time += time.perf_counter() - s0
    elapsed = time.perf_counter() - t0
    ttft = sorted(engine.counters.ttft_s)
    c = engine.counters
    return {"elapsed_s": elapsed, "steps": steps,
            "computed_prompt_tokens": c.prompt_tokens - c.cached_prompt_tokens,
            "early_steps_s": prefill_time, "ttft_p50_s": ttft[len(ttft) // 2]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--per-group", type=int, default=8)
    p.add_argument("--system", type=int, default=128)
    p.add_argument("--question", type=int, default=64)
    p.add_argument("--output", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--variants", default="prefix,prefix-nodefer,noprefix")
    a = p.parse_args()
    model, tok, _ = load_model(EngineConfig())
    wl = shared_prefix_workload(tok, a.groups, a.per_group, a.system, a.question, a.output)
    variants = a.variants.split(",")
    warm = wl.prompts[:2]
    for v in variants:
        run_once(model, tok, warm, 2, v)
    runs = {v: [] for v in variants}
    for r in range(a.repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[v].append(run_once(model, tok, wl.prompts, a.output, v))
    print(f"{len(wl.prompts)} prompts ({a.groups} x {a.per_group}), {a.system}-token prefix, "
          f"{a.question}-token questions, {a.output} output tokens; medians of {a.repeats}")
    for v, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        total = (wl.num_prompt_tokens + wl.num_output_tokens) / med["elapsed_s"]
        print(f"{v:15s} total {med['elapsed_s']:7.2f} s ({total:6.1f} tok/s)  steps "
              f"{med['steps']:4.0f}  computed prompt tokens {med['computed_prompt_tokens']:6.0f}"
              f"  prefill-phase steps {med['early_steps_s']:6.2f} s  TTFT p50 "
              f"{med['ttft_p50_s']:6.2f} s")


if __name__ == "__main__":
    main()
