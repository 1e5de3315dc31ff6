"""``mlxpa run --ray --num-replicas N`` against a local run, on a shared-prefix file and a
random file (the shapes of ``mlxpa bench``'s workloads, written as JSONL text prompts).

For each file: a local run, a Ray run with prefix-aware sharding and one with random
sharding. Prints (and writes as JSON with ``--json``) wall time, the ratio to the local run,
where the Ray run's time went (Ray start-up, the driver's validation + tokenization +
sharding, shard serialization, model load per replica, the pipeline), the global prefix-cache
hit rate of each run, whether the outputs are identical, and the scaling expected on N
machines from the measured per-replica throughput and fixed overheads.

Quick check (minutes): ``python benchmarks/ray_scaling.py --tiny``.
Full run (a quiet machine): ``python benchmarks/ray_scaling.py --num-replicas 2
--json benchmarks/results/ray_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlxpa.batch.run import RunOptions, run_file  # noqa: E402
from mlxpa.bench.workloads import random_workload, shared_prefix_workload  # noqa: E402
from mlxpa.config import EngineConfig
from mlxpa.ray.run import RayOptions, run_file_ray  # noqa: E402
from mlxpa.sampling_params import SamplingParams  # noqa: E402


def write_file(path: str, workload, tokenizer) -> None:
    """The workload's prompts as text rows (decoded token ids) with their output lengths."""
    with open(path, "w") as f:
        for i, (ids, n) in enumerate(zip(workload.prompts, workload.output_lens)):
            text = tokenizer.decode(ids[1:] if ids and ids[0] == tokenizer.bos_token_id else ids)
            f.write(json.dumps({"id": i, "prompt": text, "max_tokens": n,
                                "ignore_eos": True}) + "\n")


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _strip(rows: list[dict]) -> list[dict]:
    """Rows without ``cached_tokens`` (it depends on which rows shared a replica's cache)."""
    return [{k: v for k, v in r.items() if k != "cached_tokens"} for r in rows]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def shard_serialization(path: str, config: EngineConfig, replicas: int) -> dict:
    """Bytes and seconds to pickle the shards the driver sends (prompt ids + rows)."""
    from mlx_lm.utils import load_tokenizer

    from mlxpa.batch.requests import to_request
    from mlxpa.data import read_rows
    from mlxpa.inputs import InputProcessor
    from mlxpa.loader.models import resolve_model

    processor = InputProcessor(load_tokenizer(resolve_model(config.model)))
    items = [(r, to_request(r, SamplingParams(), processor)) for r in read_rows(path)]
    items = [it for it in items if not isinstance(it[1], str)]
    start = time.perf_counter()
    blob = pickle.dumps(items)
    return {"shard_bytes": len(blob), "shard_pickle_s": time.perf_counter() - start}


def bench_file(name: str, path: str, config: EngineConfig, replicas: int, out: str) -> dict:
    """Local, Ray prefix-sharded and Ray randomly sharded runs of ``path``."""
    defaults = SamplingParams()
    quiet = RunOptions(show_progress=False)
    local, local_s = timed(run_file, path, f"{out}/{name}.local.jsonl", config, defaults,
                           quiet)
    res = {"local_s": local_s, "local_hit_rate": local.prefix_cache_hit_rate,
           "local_output_tok_s": local.output_tokens_per_s}
    for sharding in ("prefix", "random"):
        m, s = timed(run_file_ray, path, f"{out}/{name}.{sharding}.jsonl", config, defaults,
                     quiet, RayOptions(num_replicas=replicas, sharding=sharding))
        got, want = (_rows(f"{out}/{name}.{k}.jsonl") for k in (sharding, "local"))
        res[sharding] = {"wall_s": s, "ratio_to_local": local_s / s,
                         "identical_output": _strip(got) == _strip(want),
                         "identical_cached_tokens": got == want,
                         "hit_rate": m["prefix_cache_hit_rate"],
                         **{k: m[k] for k in ("ray_init_s", "driver_s", "replica_load_s",
                                              "elapsed_s", "output_tokens_per_s",
                                              "peak_kv_blocks", "num_shards", "requests")}}
    for sharding in ("prefix", "random"):
        res[sharding]["hit_rate_vs_local"] = (res[sharding]["hit_rate"]
                                              / max(local.prefix_cache_hit_rate, 1e-9))
    res.update(shard_serialization(path, config, replicas))
    return res


def expected_scaling(res: dict, replicas: int, machines: list[int]) -> dict:
    """Wall time on M machines (one replica each, each as fast as this machine's local run):
    fixed = Ray start-up + driver + the slowest model load; work = the local run's whole time
    (its model load included, so the estimate is conservative), split evenly over M. The
    replicas' own elapsed time is not used: on one 2-core machine they share its cores, so
    each ran at about half the speed it would have alone."""
    p = res["prefix"]
    fixed = p["ray_init_s"] + p["driver_s"] + max(p["replica_load_s"] or [0.0])
    work = res["local_s"]
    return {"fixed_s": fixed, "replica_work_s": work,
            "wall_s": {m: fixed + work / m for m in machines},
            "speedup_vs_local": {m: res["local_s"] / (fixed + work / m) for m in machines}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: Gemma 3 270M")
    ap.add_argument("--num-replicas", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a quick check: 2x4 prompts")
    ap.add_argument("--random-prompts", type=int, default=128,
                    help="rows of the random file (320-token prompts, 64 output tokens)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from mlx_lm.utils import load_tokenizer

    from mlxpa.loader.models import resolve_model

    tok = load_tokenizer(resolve_model(args.model))
    if args.tiny:
        shared = shared_prefix_workload(tok, 2, 4, 64, 16, 8)
        rand = random_workload(tok, 8, 64, 8, 0.5)
    else:
        shared = shared_prefix_workload(tok, 8, 16, 512, 64, 32)
        rand = random_workload(tok, args.random_prompts, 320, 64, 0.6)
    config = EngineConfig(model=args.model)
    out = tempfile.mkdtemp(prefix="mlxpa-ray-bench-")
    results = {}
    for name, wl in (("shared-prefix", shared), ("random", rand)):
        path = f"{out}/{name}.jsonl"
        write_file(path, wl, tok)
        results[name] = bench_file(name, path, config, args.num_replicas, out)
        results[name]["expected"] = expected_scaling(results[name], args.num_replicas,
                                                     [1, 2, 4, 8, 16])
        print(name, json.dumps(results[name], indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_replicas": args.num_replicas, "tiny": args.tiny, **results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
