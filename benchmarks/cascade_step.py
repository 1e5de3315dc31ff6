"""Per-layer attention time of one decode step on the shared-prefix workload, cascade attention
on and off, at the workload's real shapes; and whole decode steps with it on and off.

    python benchmarks/cascade_step.py [--num-groups 4] [--prompts-per-group 32]
        [--system-prompt-len 4096] [--question-len 64] [--rounds 5] [--model M]

The engine runs SGLang's generated shared-prefix workload (``mlxpa bench --workload
shared-prefix``) until every request decodes; then, interleaved over ``--rounds`` rounds in one
process, it times (medians, ``mx.eval`` around each call):

- each layer kind's attention as the model runs it (``PagedLayerCache.attend`` of the step's
  decode batch: full attention and each sliding window), with the step's cascade tables and
  without them, times the number of layers of that kind;
- whole engine steps, cascade attention on and off alternately (``--disable-cascade-attn``).

On a shared machine read the ratios, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import mlx.core as mx

from mlxpa.bench.workloads import shared_prefix_workload
from mlxpa.config import EngineConfig
from mlxpa.core.kv_sizing import kv_blocks_needed
from mlxpa.core.prefix_order import prefix_order
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.attention import PagedLayerCache
from mlxpa.worker.model_runner import _rows_of
from mlxpa.worker.paged_forward import paged_context


def decoding_engine(model, tok, a) -> LLMEngine:
    """An engine whose every request of the workload is decoding (prefills done)."""
    wl = shared_prefix_workload(tok, a.num_groups, a.prompts_per_group, a.system_prompt_len,
                                a.question_len, output_len=10_000)
    config = EngineConfig(model=a.model, max_num_seqs=max(128, len(wl.prompts)))
    lengths = ((len(p), a.decode_steps + 8, 1) for p in wl.prompts)
    engine = LLMEngine(config, model, tok,
                       kv_blocks_needed=kv_blocks_needed(lengths, config.block_size))
    for i in prefix_order(wl.prompts, config.block_size):
        engine.add_request(str(i), wl.prompts[i], SamplingParams(max_tokens=a.decode_steps + 8,
                                                            ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_tokens - 1 for r in sched.running):
        engine.step()
    return engine


def layer_kinds(model, runner) -> dict[int | None, list[int]]:
    """Cache entries by their window (None: full attention), gathered layers left out."""
    kinds: dict[int | None, list[int]] = {}
    for i, (w, g) in enumerate(zip(runner.windows, runner.geometry.gathered or
                                   [False] * len(runner.windows))):
        if runner.kv_cache.specs[i].kv_heads and not g:
            kinds.setdefault(w, []).append(i)
    return kinds


def seconds(fn) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t0


def time_layers(model, runner, out, rounds: int) -> dict:
    """Median seconds of each layer kind's attention of the step ``out`` (a decode batch)
    with its cascade tables and without them, interleaved over ``rounds`` rounds after a
    warm-up; the groups each kind keeps."""
    reqs, counts = out.requests, out.num_scheduled_tokens
    groups = _rows_of(out.cascade_groups, list(range(len(reqs))))
    _, meta_on = runner._metadata(reqs, counts, groups)
    _, meta_off = runner._metadata(reqs, counts)
    kinds = layer_kinds(model, runner)
    print(f"{len(reqs)} decode rows, context {min(r.num_tokens for r in reqs)}-"
          f"{max(r.num_tokens for r in reqs)} tokens; scheduler groups (rows x shared blocks: "
          f"count): {dict(Counter((len(g.indices), g.num_blocks) for g in out.cascade_groups))}")
    spec = runner.kv_cache.specs
    heads = model.args.num_attention_heads
    queries = {w: mx.random.normal((len(reqs), heads, 1, spec[ix[0]].k_dim)).astype(
        runner.dtype) for w, ix in kinds.items()}
    mx.eval(*queries.values())
    times: dict[tuple, list[float]] = {}
    with paged_context(model, runner.config.fused_cpu_ops):
        for _ in range(rounds + 1):
            for w, ix in kinds.items():
                for name, meta in (("on", meta_on), ("off", meta_off)):
                    cache = PagedLayerCache(runner.kv_cache, ix[0], meta, w)
                    scale = spec[ix[0]].k_dim ** -0.5
                    times.setdefault((w, name), []).append(
                        seconds(lambda c=cache, q=queries[w], s=scale: c.attend(q, s)))
    kept = {w: (meta_on.cascade[w].prefix.rows.shape[0] if w in meta_on.cascade else 0)
            for w in kinds}
    return {"med": {k: statistics.median(v[1:]) for k, v in times.items()}, "kept": kept,
            "kinds": kinds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-groups", type=int, default=4)
    ap.add_argument("--prompts-per-group", type=int, default=32)
    ap.add_argument("--system-prompt-len", type=int, default=4096)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    a.decode_steps = 2 * (a.rounds + 1) + 2
    model, tok, _ = load_model(EngineConfig(model=a.model))
    engine = decoding_engine(model, tok, a)
    runner = engine.runner
    layers: dict = {}
    execute = runner.execute

    def timed_execute(out):   # time the step's attention before running it
        layers.update(time_layers(model, runner, out, a.rounds))
        return execute(out)

    runner.execute = timed_execute
    engine.step()
    runner.execute = execute
    step = {"on": [], "off": []}
    for _ in range(a.rounds + 1):
        for name in ("on", "off"):
            engine.scheduler.enable_cascade_attention = name == "on"
            t0 = time.perf_counter()
            engine.step()
            step[name].append(time.perf_counter() - t0)
    med, kept, kinds = layers["med"], layers["kept"], layers["kinds"]
    print("| layer kind | layers | groups kept | attention ms, cascade off | on | off / on |")
    print("|---|---|---|---|---|---|")
    total = {"on": 0.0, "off": 0.0}
    for w, ix in kinds.items():
        n = kept[w]
        on, off = med[(w, "on")], med[(w, "off")]
        total["on"] += on * len(ix)
        total["off"] += off * len(ix)
        name = "full" if w is None else f"window {w}"
        print(f"| {name} | {len(ix)} | {n} | {off * 1e3:.2f} | {on * 1e3:.2f} | "
              f"{off / on:.2f} |")
    print(f"attention per step: {total['off'] * 1e3:.0f} ms off, {total['on'] * 1e3:.0f} ms on "
          f"({total['off'] / total['on']:.2f}x)")
    s_on, s_off = (statistics.median(step[k][1:]) for k in ("on", "off"))
    print(f"decode step: {s_off * 1e3:.0f} ms off, {s_on * 1e3:.0f} ms on ({s_off / s_on:.2f}x)")


if __name__ == "__main__":
    main()
