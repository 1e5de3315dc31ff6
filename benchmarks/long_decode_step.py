"""Where a step over long contexts goes (the long-document workload): the default model,
``--rows`` requests of ``--prompt-len`` random tokens under ``--kv-memory``, their prompts' K/V
laid out in the pool as 256-token chunks would leave them (window blocks freed, blocks filled
with random values) without running the prefill, then whole engine steps and the step's parts
timed alone at its shapes, medians over rounds. A step decodes one token of every row, or
with ``--chunk C`` prefills the C prompt tokens before each row's last one (the rows' computed
tokens are set back after each step, so every round times the same step).

    python benchmarks/long_decode_step.py [--rows 16] [--prompt-len 8202] [--chunk 1]
        [--rounds 5]

Prints a table of milliseconds per step by part and the bytes a step reads (weights, K/V):
the bandwidth floor next to the measured step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np
from timing import seconds  # benchmarks/timing.py

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.request import RequestStatus
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.attention import PagedLayerCache
from mlxpa.worker.paged_forward import paged_context

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=16)
ap.add_argument("--prompt-len", type=int, default=8202)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--chunk", type=int, default=1, help="prompt tokens a row computes a step")
ap.add_argument("--kv-memory", type=float, default=1.0, help="GiB")
args = ap.parse_args()

config = EngineConfig(kv_cache_memory_bytes=int(args.kv_memory * 2**30),
                      max_num_batched_tokens=2048)
model, tok, _ = load_model(config)
engine = LLMEngine(config, model, tok)
sched, kv = engine.scheduler, engine.kv_cache_manager
rng = np.random.default_rng(0)
for i in range(args.rows):
    prompt = rng.integers(1000, 200_000, args.prompt_len).tolist()
    engine.add_request(str(i), prompt, SamplingParams(max_tokens=10_000, ignore_eos=True))

# The prefill's block layout without its compute: 256-token chunks, windows trimmed.
while sched.waiting:
    req = sched.waiting.popleft()
    req.status, req.num_cached_tokens = RequestStatus.RUNNING, 0
    ready = req.num_prompt_tokens - 1 - (args.chunk if args.chunk > 1 else 0)
    while req.num_computed_tokens < ready:
        n = min(256, ready - req.num_computed_tokens)
        assert kv.allocate_slots(req, n) is not None, "the pool is too small for the rows"
        req.num_computed_tokens += n
        kv.cache_blocks(req)
    sched.running.append(req)
runner = engine.runner
pool = runner.kv_cache
C = args.chunk


def step() -> None:
    before = {r.key: r.num_computed_tokens for r in sched.running}
    engine.step()
    if C > 1:  # the same chunk again next time
        for r in sched.running:
            r.num_computed_tokens = before[r.key]


step()  # the runner adopts the requests' tables
for caches in (pool.key_caches, pool.value_caches):
    for j, c in enumerate(caches):
        caches[j] = mx.random.normal(c.shape).astype(c.dtype) * 0.5  # real pages, not zeros
        mx.eval(caches[j])

out = sched.schedule()
reqs, counts = out.requests, out.num_scheduled_tokens
tokens, meta = runner._metadata(reqs, counts)
B = len(reqs)
A = model.args
layers = model.model.layers
full = next(i for i, layer in enumerate(layers) if not layer.self_attn.is_sliding)
window = next(i for i, layer in enumerate(layers) if layer.self_attn.is_sliding)
attn = layers[full].self_attn
H, KVH, D = attn.n_heads, attn.n_kv_heads, A.head_dim
rnd = lambda *s: mx.random.normal(s) * 0.5  # noqa: E731
L = max(counts)
x, a = rnd(B, L, A.hidden_size), rnd(B, L, H * D)
q = rnd(B, H, L, D)
hrows = rnd(B, A.hidden_size)
mx.eval(x, a, q, hrows)
slot = {i: (g, j) for g, spec in enumerate(runner.kv_cache_layout.groups)
        for j, i in enumerate(spec.entries)}


def cache_for(layer: int) -> PagedLayerCache:
    g, j = slot[layer]
    w = runner.kv_cache_layout.groups[g].sliding_window
    return PagedLayerCache(pool, j, meta, w, group=g)


mlp = layers[full].mlp
PARTS = {  # name: (lazy result, calls per step)
    "attention, full layer": (lambda: cache_for(full).attend(q, attn.scale),
                              sum(not la.self_attn.is_sliding for la in layers)),
    "attention, window layer": (lambda: cache_for(window).attend(q, attn.scale),
                                sum(la.self_attn.is_sliding for la in layers)),
    "matmuls q/k/v/o": (lambda: [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x),
                                 attn.o_proj(a)], len(layers)),
    "MLP": (lambda: mlp(x), len(layers)),
    "LM head": (lambda: runner._split.head(hrows), 1 if C == 1 else 0),
}


times: dict[str, list[float]] = {n: [] for n in [*PARTS, "step"]}
for _ in range(args.rounds):
    with paged_context(model, True):
        for n, (fn, _) in PARTS.items():
            times[n].append(seconds(fn))
    t0 = time.perf_counter()
    step()
    times["step"].append(time.perf_counter() - t0)
med = {n: statistics.median(v) for n, v in times.items()}
step = med["step"]
ctx = int(np.mean([r.num_tokens for r in reqs]))
print(f"{'decode' if C == 1 else f'{C}-token chunks'}: {B} rows, contexts ~{ctx:,} tokens, "
      f"{args.rounds} rounds, median step "
      f"{step * 1e3:.0f} ms")
print("| part | ms per call | calls | ms per step | share |")
print("|---|---|---|---|---|")
total = 0.0
for n, (_, cnt) in PARTS.items():
    total += med[n] * cnt
    print(f"| {n} | {med[n] * 1e3:.1f} | {cnt} | {med[n] * cnt * 1e3:.0f} | "
          f"{med[n] * cnt / step:.2f} |")
print(f"| rest (norms, RoPE, K/V writes, sampling, Python) | | | {(step - total) * 1e3:.0f} | "
      f"{(step - total) / step:.2f} |")
weights = sum(v.nbytes for _, v in __import__("mlx.utils").utils.tree_flatten(
    model.parameters()))
kv_bytes = sum(len([b for b in t if b]) for r in reqs for t in r.block_tables) \
    * runner.block_bytes
print(f"a step reads {weights / 1e9:.2f} GB of weights and {kv_bytes / 1e9:.2f} GB of K/V")
