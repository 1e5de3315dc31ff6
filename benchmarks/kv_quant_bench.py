"""Quantized KV cache (``--kv-cache-dtype``): memory, accuracy and throughput in one
run, on the default model (or ``--model``).

1. Bytes per KV token of each dtype, counted from ``.nbytes`` of the arrays of 9-block pools
   built as the engine builds them, in the compute dtype this machine uses and in bfloat16
   (the Apple GPU's), with the ratio to a bfloat16 pool.
2. ``choice_logprobs`` of ``examples/annotation.jsonl`` (``mlxpa run --choice``, one process per
   dtype) for int8, int4 and k8v4 against auto: the largest difference in nats.
3. Memory the limit: a random workload with ``--kv-memory`` set to ``--kv-fraction`` of what
   its rows need in auto (so the auto pool preempts), timed in auto and int8 alternately
   (``--repeats``, medians), with each run's preemption count.
4. Memory not the limit: the same workload with a pool that holds every row, auto vs int8.

    python benchmarks/kv_quant_bench.py [--model FOLDER] [--num-prompts 64 --input-len 320
        --output-len 64 --max-num-seqs 64 --kv-fraction 0.4 --repeats 3] [--json out.json]
        [--parts bytes,choice_logprobs,memory_limited,memory_ample]

Timings are for a quiet machine; the script prints them and writes every figure to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DTYPES = ("auto", "int8", "int4", "k8v4")
ANNOTATION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "examples", "annotation.jsonl")


def bytes_per_token(model, block_size: int, group_size: int) -> dict[str, float]:
    """Per dtype, ``nbytes`` of every array of a 9-block pool built as the engine builds it
    (the probed geometry, :func:`mlxpa.worker.kv_storage.kv_storage`), over its token slots.
    No load check runs (the default model in bfloat16 fails it on MLX's CPU back end)."""
    from mlxpa.worker.kv_cache import PagedKVCache
    from mlxpa.worker.kv_storage import kv_storage
    from mlxpa.worker.model_probe import probe_model

    geometry = probe_model(model)
    out = {}
    for d in DTYPES:
        storage = kv_storage(geometry, d, group_size)
        pool = PagedKVCache(storage.specs, 9, block_size, storage.dtype)
        out[d] = pool.nbytes / (9 * block_size)
    return out


def choice_logprobs(model: str | None, path: str, choices: str,
                    group_size: int) -> dict[str, dict]:
    """Per dtype, ``{row id: choice_logprobs}`` of ``mlxpa run --choice`` on ``path``."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in DTYPES:
            target = os.path.join(tmp, f"{d}.jsonl")
            cmd = [sys.executable, "-m", "mlxpa", "run", path, "-o", target, "--choice",
                   choices, "--kv-cache-dtype", d, "--kv-group-size", str(group_size),
                   "-q"] + (["--model", model] if model else [])
            subprocess.run(cmd, check=True)
            with open(target) as f:
                out[d] = {r["id"]: r["choice_logprobs"] for r in map(json.loads, f)}
    return out


def largest_difference(rows: dict[str, dict], base: dict[str, dict]) -> float:
    """Largest ``|choice_logprob - base|`` over rows and choices, nats."""
    return max(abs(v - base[i][c]) for i, r in rows.items() for c, v in r.items())


def timed(model, tok, wl, configs: dict, repeats: int) -> dict[str, dict]:
    """Each config's median figures over ``repeats`` runs, configs alternating (after one
    warm-up run each on two prompts); every run's preemption count kept."""
    from mlxpa.bench.systems import run_system

    small = wl._replace(prompts=wl.prompts[:2], output_lens=[4, 4])
    for config in configs.values():
        run_system("mlxpa", model, tok, small, config)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(repeats):
        names = list(configs)[r % 2:] + list(configs)[:r % 2]
        for name in names:
            runs[name].append(run_system("mlxpa", model, tok, wl, configs[name]).figures())
    out = {}
    for name, rs in runs.items():
        out[name] = {k: statistics.median(x[k] for x in rs)
                     for k in ("total_tokens_per_s", "output_tokens_per_s", "elapsed_s")}
        out[name]["num_preemptions"] = [x["num_preemptions"] for x in rs]
        out[name]["peak_kv_blocks"] = [x["peak_kv_blocks"] for x in rs]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="MLX folder (default: the default model)")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=320)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-group-size", type=int, default=64)
    ap.add_argument("--kv-fraction", type=float, default=0.4,
                    help="the memory-limited pool: this fraction of what the rows need in auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--annotation", default=ANNOTATION)
    ap.add_argument("--choices", default="positive,negative,neutral")
    ap.add_argument("--parts", default="bytes,choice_logprobs,memory_limited,memory_ample",
                    help="comma-separated parts to run (default: all four)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    parts = set(a.parts.split(","))
    unknown = parts - {"bytes", "choice_logprobs", "memory_limited", "memory_ample"}
    if unknown:
        ap.error(f"unknown --parts: {', '.join(sorted(unknown))}")
    results: dict = {"args": vars(a)}
    model, tok, _ = load_model(EngineConfig(model=a.model))
    gs = a.kv_group_size
    if "bytes" in parts:
        bytes_part(a, model, results)
    if "choice_logprobs" in parts:
        logprobs = choice_logprobs(a.model, a.annotation, a.choices, gs)
        results["choice_logprobs"] = logprobs
        results["choice_logprobs_largest_difference"] = {
            d: largest_difference(logprobs[d], logprobs["auto"]) for d in DTYPES if d != "auto"}
        print("choice_logprobs, largest |difference| from auto (nats):",
              json.dumps(results["choice_logprobs_largest_difference"]))
    throughput_parts(a, model, tok, [p for p in ("memory_limited", "memory_ample") if p in parts],
                     results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def bytes_part(a, model, results: dict) -> None:
    """Part 1: bytes per KV token of each dtype, in the compute dtype and in bfloat16."""
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    gs = a.kv_group_size
    results["bytes_per_token"] = native = bytes_per_token(model, a.block_size, gs)
    bf16, _, _ = load_model(EngineConfig(model=a.model, dtype="bfloat16"))
    results["bytes_per_token_bfloat16"] = bf = bytes_per_token(bf16, a.block_size, gs)
    del bf16
    results["fewer_than_auto"] = {d: native["auto"] / b for d, b in native.items()}
    results["fewer_than_bfloat16"] = {d: bf["auto"] / b for d, b in bf.items()}
    print(f"bytes per KV token, compute dtype: {json.dumps(native)}; bfloat16 pools: "
          f"{json.dumps(bf)}; times "
          "fewer than auto: "
          + json.dumps({d: round(x, 2) for d, x in results["fewer_than_auto"].items()})
          + "; bfloat16 pools, times fewer than bfloat16: "
          + json.dumps({d: round(x, 2) for d, x in results["fewer_than_bfloat16"].items()}))


def throughput_parts(a, model, tok, names: list[str], results: dict) -> None:
    """Parts 3 and 4: the random workload timed in auto and int8, memory the limit or not."""
    from mlxpa.bench.workloads import random_workload
    from mlxpa.config import EngineConfig
    from mlxpa.core.kv_sizing import kv_blocks_needed
    from mlxpa.worker.kv_storage import kv_storage
    from mlxpa.worker.model_probe import probe_model

    gs = a.kv_group_size
    wl = random_workload(tok, a.num_prompts, a.input_len, a.output_len)
    need = kv_blocks_needed(((len(p), n, 1) for p, n in zip(wl.prompts, wl.output_lens)),
                            a.block_size, 1 << 40)
    auto_bytes = kv_storage(probe_model(model)).block_bytes(a.block_size)
    limited = a.kv_fraction * need * auto_bytes / 2**30
    ample = 2 * need * auto_bytes / 2**30

    def configs(kv_memory: float) -> dict[str, EngineConfig]:
        return {d: EngineConfig(block_size=a.block_size,
                                kv_cache_memory_bytes=int(kv_memory * 2**30),
                                max_num_seqs=a.max_num_seqs, kv_cache_dtype=d,
                                kv_group_size=gs) for d in ("auto", "int8")}

    for name, gib in (("memory_limited", limited), ("memory_ample", ample)):
        if name not in names:
            continue
        figs = timed(model, tok, wl, configs(gib), a.repeats)
        figs["kv_memory_gib"] = gib
        figs["int8_speedup"] = (figs["int8"]["total_tokens_per_s"]
                                / figs["auto"]["total_tokens_per_s"])
        results[name] = figs
        print(f"{name} (--kv-memory {gib:.4f} GiB, rows need {need} blocks in auto): "
              f"auto {figs['auto']['total_tokens_per_s']:.1f} total tok/s, preemptions "
              f"{figs['auto']['num_preemptions']}; int8 {figs['int8']['total_tokens_per_s']:.1f} "
              f"total tok/s, preemptions {figs['int8']['num_preemptions']}; "
              f"int8 / auto = {figs['int8_speedup']:.2f}")
        if name == "memory_limited" and not any(figs["auto"]["num_preemptions"]):
            print("warning: the auto pool did not preempt; lower --kv-fraction or lengthen "
                  "the outputs (--output-len) for a memory-limited run")


if __name__ == "__main__":
    sys.exit(main())
