"""What sampling costs a decode-bound run: the same rows greedy and sampled, ours and mlx-lm's.

The workload: ``--num-prompts`` random prompts of about ``--input-len`` tokens (vLLM's random
dataset, :func:`~mlxpa.bench.workloads.random_workload`), each generating exactly
``--output-len`` tokens (EOS ignored). Four systems on the same token ids and model object:

- ``mlxpa-greedy`` / ``mlxpa-sampled``: this engine with every row greedy, or every row
  sampled with ``--temperature``, ``--top-p``, ``--top-k`` and its own seed;
- ``mlx-lm-greedy`` / ``mlx-lm-sampled``: ``mlx_lm.batch_generate``'s loop (a
  ``BatchGenerator``) with its default sampler, or with ``make_sampler`` of the same values.

Each system runs once untimed (warm-up), then ``--repeats`` timed rounds run every system in
turn, the order rotating between rounds so machine noise hits all alike. Printed (and written
to ``--json``): per system the median output tokens per second and ITL p50 (the engine's
inter-token latency; mlx-lm reports none), each round's figures, and the ratio of sampled to
greedy output tok/s for both engines.

    python benchmarks/sampling_bench.py                        # default model, 128 x 48
    python benchmarks/sampling_bench.py --systems mlxpa-greedy,mlxpa-sampled --repeats 3
    python benchmarks/sampling_bench.py --num-prompts 8 --output-len 4 --repeats 1  # quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlxpa.bench.workloads import random_workload
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import percentile
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams

SYSTEMS = ("mlxpa-greedy", "mlxpa-sampled", "mlx-lm-greedy", "mlx-lm-sampled")


def run_mlxpa(model, tok, prompts, output_len: int, sampled: bool, args) -> dict:
    """Our engine on ``prompts``; every row greedy, or sampled with the script's values and
    a seed of its own."""
    engine = LLMEngine(EngineConfig(
        max_num_seqs=len(prompts), kv_cache_memory_bytes=int(args.kv_memory_gib * 2**30)),
                       model, tok)
    t0 = time.perf_counter()
    engine.counters.start_time = t0
    for i, p in enumerate(prompts):
        params = (SamplingParams(max_tokens=output_len, ignore_eos=True,
                                 temperature=args.temperature, top_p=args.top_p,
                                 top_k=args.top_k, seed=1000 + i) if sampled else
                  SamplingParams(max_tokens=output_len, ignore_eos=True))
        engine.add_request(str(i), p, params)
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - t0
    c = engine.counters
    return {"output_tokens_per_s": c.generation_tokens / elapsed, "elapsed_s": elapsed,
            "generation_tokens": c.generation_tokens, "itl_p50_s": percentile(c.itl_s, 50)}


def run_mlx_lm(model, tok, prompts, output_len: int, sampled: bool, args) -> dict:
    """``mlx_lm.batch_generate``'s loop on ``prompts`` (EOS ignored), with its default
    sampler (greedy) or ``make_sampler`` of the script's values."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    sampler = (make_sampler(temp=args.temperature, top_p=args.top_p, top_k=args.top_k)
               if sampled else None)
    t0 = time.perf_counter()
    gen = BatchGenerator(model, stop_tokens=[], sampler=sampler)
    uids = gen.insert(prompts, [output_len] * len(prompts))
    tokens = {uid: 0 for uid in uids}
    while responses := gen.next_generated():
        for r in responses:
            if r.finish_reason != "stop":
                tokens[r.uid] += 1
    gen.close()
    elapsed = time.perf_counter() - t0
    generated = sum(tokens.values())
    return {"output_tokens_per_s": generated / elapsed, "elapsed_s": elapsed,
            "generation_tokens": generated, "itl_p50_s": None}


def run(name: str, model, tok, prompts, output_len: int, args) -> dict:
    mx.synchronize()
    mx.clear_cache()
    runner = run_mlxpa if name.startswith("mlxpa") else run_mlx_lm
    return runner(model, tok, prompts, output_len, name.endswith("sampled"), args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="Model (default: mlxpa's default model).")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=20)
    ap.add_argument("--range-ratio", type=float, default=0.25)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--kv-memory-gib", type=float, default=1.0,
                    help="Our engine's KV pool (the workload needs a few hundred MiB).")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--repeats", type=int, default=2, help="Timed rounds (median).")
    ap.add_argument("--json", default=None, help="Write the figures here.")
    args = ap.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")

    model, tok, _ = load_model(EngineConfig(model=args.model))
    wl = random_workload(tok, args.num_prompts, args.input_len, args.output_len,
                         args.range_ratio, seed=0)
    print(f"{len(wl.prompts)} prompts, {wl.num_prompt_tokens} prompt tokens, "
          f"{args.output_len} output tokens each; sampled: temperature {args.temperature}, "
          f"top_p {args.top_p}, top_k {args.top_k}, one seed per row", flush=True)
    warm = random_workload(tok, 4, args.input_len, 4, args.range_ratio, seed=1)
    for name in systems:
        run(name, model, tok, warm.prompts, 4, args)
    rounds: dict[str, list[dict]] = {s: [] for s in systems}
    for k in range(args.repeats):
        for name in systems[k % len(systems):] + systems[:k % len(systems)]:
            res = run(name, model, tok, wl.prompts, args.output_len, args)
            rounds[name].append(res)
            itl = "" if res["itl_p50_s"] is None else f", ITL p50 {res['itl_p50_s']:.3f} s"
            print(f"round {k + 1} {name:15s} {res['output_tokens_per_s']:7.1f} out tok/s "
                  f"({res['elapsed_s']:.1f} s){itl}", flush=True)
    figures = {}
    for name, runs in rounds.items():
        itls = [r["itl_p50_s"] for r in runs if r["itl_p50_s"] is not None]
        figures[name] = {"output_tokens_per_s": statistics.median(
            r["output_tokens_per_s"] for r in runs),
            "itl_p50_s": statistics.median(itls) if itls else None, "runs": runs}
    print("median over rounds:")
    for name, f in figures.items():
        itl = "" if f["itl_p50_s"] is None else f", ITL p50 {f['itl_p50_s']:.3f} s"
        print(f"  {name:15s} {f['output_tokens_per_s']:7.1f} out tok/s{itl}")
    for engine in ("mlxpa", "mlx-lm"):
        g, s = figures.get(f"{engine}-greedy"), figures.get(f"{engine}-sampled")
        if g and s:
            ratio = s["output_tokens_per_s"] / g["output_tokens_per_s"]
            figures[f"{engine}_sampled_to_greedy"] = ratio
            print(f"  {engine}: sampled / greedy output tok/s = {ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "figures": figures}, f, indent=2)


if __name__ == "__main__":
    main()
