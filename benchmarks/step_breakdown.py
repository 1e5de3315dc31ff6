"""Where one engine step of the default model goes: every op category timed in isolation at
the step's real shapes (``mx.eval`` around it), interleaved with whole engine steps in one
process, medians over rounds; the categories times their count per step, summed, against
the measured step (on a shared machine read the fractions, not the absolute seconds).

    python benchmarks/step_breakdown.py prefill [rounds]   # one 4 x 512-token prefill step
    python benchmarks/step_breakdown.py decode [rounds]    # one 128-row decode step

Also prints each matmul category's GFLOP/s next to the 2048^3 GEMM rate, and the per-step
Python (scheduler, numpy step inputs, graph building, detokenizer) from wrapped calls.
"""

import statistics
import sys
import time

import mlx.core as mx
from timing import seconds  # benchmarks/timing.py

from mlxpa.bench.limits import gemm_flops_per_s
from mlxpa.bench.workloads import random_workload
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.kernels import cpu_fused
from mlxpa.kernels import cpu_paged_attention as cpa
from mlxpa.kernels.reference import attention_mask, gather_kv
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import model_runner
from mlxpa.worker.attention import PagedLayerCache
from mlxpa.worker.paged_forward import paged_context
from mlxpa.worker.sampler import Sampler

MODE = sys.argv[1] if len(sys.argv) > 1 else "prefill"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
model, tok, _ = load_model(EngineConfig())
ARGS = model.args
NL = ARGS.num_hidden_layers


def new_engine() -> LLMEngine:
    rows, plen, out = (4, 512, 1) if MODE == "prefill" else (128, 8, 10_000)
    wl = random_workload(tok, rows, plen, 1, 0.0)
    e = LLMEngine(EngineConfig(kv_cache_memory_bytes=2**29, max_num_batched_tokens=2048), model,
                  tok)
    for i, p in enumerate(wl.prompts):
        e.add_request(str(i), p, SamplingParams(max_tokens=out, ignore_eos=True))
    if MODE == "decode":
        for _ in range(4):
            e.step()
    return e


# Per-step Python, from wrapped calls (seconds of the last step).
PY: dict[str, float] = {}


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        r = fn(*a, **k)
        PY[name] = PY.get(name, 0.0) + time.perf_counter() - t0
        return r
    return wrapper


model_runner.forward = timed("graph build (forward, lazy)", model_runner.forward)
Sampler.sample = timed("eval (compute) + sampling", Sampler.sample)
model_runner.ModelRunner._metadata = timed("numpy step inputs",
                                           model_runner.ModelRunner._metadata)


def engine_step(engine: LLMEngine) -> float:
    PY.clear()
    sched = engine.scheduler
    sched.schedule = timed("scheduler", type(sched).schedule.__get__(sched))
    sched.update_from_output = timed("scheduler",
                                     type(sched).update_from_output.__get__(sched))
    t0 = time.perf_counter()
    engine.step()
    return time.perf_counter() - t0


engine = new_engine()
runner = engine.runner
out = engine.scheduler.schedule()
engine.scheduler.schedule = type(engine.scheduler).schedule.__get__(engine.scheduler)
reqs, counts = out.requests, out.num_scheduled_tokens
tokens, meta = runner._metadata(reqs, counts)
B, L = tokens.shape
layer, kv = model.model.layers[0], runner.kv_cache
attn = layer.self_attn
H, KVH, D = attn.n_heads, attn.n_kv_heads, ARGS.head_dim
rnd = lambda *s: mx.random.normal(s) * 0.5  # noqa: E731
x, x2, a = rnd(B, L, ARGS.hidden_size), rnd(B, L, ARGS.hidden_size), rnd(B, L, H * D)
g, u = rnd(B, L, ARGS.intermediate_size), rnd(B, L, ARGS.intermediate_size)
q, k, v = rnd(B, H, L, D), rnd(B, KVH, L, D), rnd(B, KVH, L, D)
S = len(reqs)
hrows = rnd(S, ARGS.hidden_size)
logits = runner._split.head(hrows)
cache = PagedLayerCache(kv, 0, meta, ARGS.sliding_window)
tables = meta.window_tables.get(ARGS.sliding_window)
bt = tables.block_tables if tables is not None else meta.block_tables
kstart = tables.key_start if tables is not None else None
mx.eval(x, x2, a, g, u, q, k, v, hrows, logits)

# Attention pieces: the tiles the CPU kernel runs (prefill) or the decode softmax.
nkeys = bt.shape[1] * kv.block_size
mask = attention_mask(meta.offsets, L, meta.context_lens, nkeys, kstart, ARGS.sliding_window)
kg, vg = gather_kv(kv.key_caches[0], bt), gather_kv(kv.value_caches[0], bt)
rel = (meta.offsets - (kstart if kstart is not None else 0)).tolist()
ranges = cpa.key_ranges(rel, L, nkeys, cpa.QUERY_TILE, ARGS.sliding_window)
qg = q.reshape(B, KVH, -1, D)
tile_scores = [(qg.reshape(B, KVH, H // KVH, L, D)[:, :, :, q0:q1].reshape(B, KVH, -1, D)
                @ kg[:, :, k0:k1].swapaxes(-1, -2)).reshape(B, KVH, H // KVH, q1 - q0, -1)
               for q0, q1, k0, k1 in ranges] if L > 1 else [rnd(B, KVH, H // KVH, nkeys)]
tile_masks = [mask[:, :, q0:q1, k0:k1][:, :, None] for q0, q1, k0, k1 in ranges] \
    if L > 1 else [mask]
mx.eval(mask, kg, vg, *tile_scores, *tile_masks)


def decode_matmuls():
    """The two ``gather_mm`` products of :func:`cpa.decode_attention`, without the softmax."""
    nblk, _, bs, _ = kv.key_caches[0].shape
    nb, gq = bt.shape[1], H // KVH
    heads = mx.arange(KVH, dtype=mx.int32)
    lhs = mx.arange(B, dtype=mx.int32)[:, None, None] * KVH + heads[None, :, None]
    rhs = bt[:, None, :] * KVH + heads[None, :, None]
    lhs = mx.broadcast_to(lhs, rhs.shape).reshape(-1)
    rhs = rhs.reshape(-1)
    keys = kv.key_caches[0].reshape(nblk * KVH, bs, D).swapaxes(-1, -2)
    s = mx.gather_mm(q.reshape(B * KVH, gq, D), keys, lhs, rhs)
    p = tile_scores[0].reshape(B, KVH, gq, nb, bs).transpose(0, 1, 3, 2, 4).reshape(-1, gq, bs)
    o = mx.gather_mm(p, kv.value_caches[0].reshape(nblk * KVH, bs, D), None, rhs)
    return [s, o.reshape(B, KVH, nb, gq, D).sum(axis=2)]


def tile_matmuls():
    if L == 1:
        return decode_matmuls()
    outs = []
    for (q0, q1, k0, k1), s in zip(ranges, tile_scores):
        qt = q[:, :, q0:q1].reshape(B, KVH, -1, D)
        outs.append(qt @ kg[:, :, k0:k1].swapaxes(-1, -2))
        outs.append(s.reshape(B, KVH, -1, k1 - k0) @ vg[:, :, k0:k1])
    return outs


mlp = layer.mlp
with paged_context(model, True):
    split_mlp, rope = layer.mlp, attn.rope
CATS = {  # name: (lazy result, count per step, matmul FLOPs per call or 0)
    "matmul q/k/v": (lambda: [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], NL,
                     2 * B * L * ARGS.hidden_size * (H + 2 * KVH) * D),
    "matmul o": (lambda: attn.o_proj(a), NL, 2 * B * L * H * D * ARGS.hidden_size),
    "matmul gate/up": (lambda: [mlp.gate_proj(x), mlp.up_proj(x)], NL,
                       4 * B * L * ARGS.hidden_size * ARGS.intermediate_size),
    "matmul down": (lambda: mlp.down_proj(g), NL,
                    2 * B * L * ARGS.hidden_size * ARGS.intermediate_size),
    "matmul LM head": (lambda: runner._split.head(hrows), 1,
                       2 * S * ARGS.hidden_size * ARGS.vocab_size),
    "GELU * up (fused)": (lambda: cpu_fused.gelu_tanh(g) * u, NL, 0),
    "attention QK/PV matmuls": (tile_matmuls, NL, 0),
    "attention softmax (exp2)": (lambda: [cpa.softmax_exp2(s, m) for s, m in
                                          zip(tile_scores, tile_masks)], NL, 0),
    "attention K/V gather": (lambda: [gather_kv(kv.key_caches[0], bt),
                                      gather_kv(kv.value_caches[0], bt)], NL, 0),
    "K/V pool write": (lambda: (kv.write(0, k, v, meta.slot_blocks, meta.slot_offsets),
                                kv.key_caches[0], kv.value_caches[0])[1:], NL, 0),
    "RMSNorms (4 + q/k)": (lambda: [layer.input_layernorm(x) for _ in range(4)]
                           + [attn.q_norm(q), attn.k_norm(k)], NL, 0),
    "RoPE (table)": (lambda: [rope(q, offset=meta.offsets), rope(k, offset=meta.offsets)],
                     NL, 0),
    "residual adds": (lambda: [x + x2, x2 + x], NL, 0),
    "embedding + scale": (lambda: model.model.embed_tokens(tokens) * 25.3, 1, 0),
    "argmax (sampling)": (lambda: mx.argmax(logits, axis=-1), 1, 0),
}
WHOLE = {
    "attention as run (paged, tiles, 2 streams)": (lambda: cache.attend(q, attn.scale), NL),
    "MLP block as run (row halves, 2 streams)": (lambda: split_mlp(x), NL),
}


times = {n: [] for n in [*CATS, *WHOLE, "step"]}
py = []
for _r in range(ROUNDS + 1):
    with paged_context(model, True):
        for n, (fn, *_) in {**CATS, **WHOLE}.items():
            times[n].append(seconds(fn))
    eng = new_engine() if MODE == "prefill" else engine
    times["step"].append(engine_step(eng))
    py.append(dict(PY))
med = {n: statistics.median(v[1:]) for n, v in times.items()}
rate = gemm_flops_per_s()
step = med["step"]
print(f"{MODE}: B={B} L={L} ({B * L} tokens), {ROUNDS} rounds, median step {step:.3f} s; "
      f"GEMM 2048^3 {rate / 1e9:.1f} GFLOP/s")
print("| category | ms per call | calls | ms per step | share of step | GFLOP/s |")
print("|---|---|---|---|---|---|")
total = 0.0
for n, (_, cnt, fl) in CATS.items():
    per = med[n] * cnt
    total += per
    gf = f"{fl / med[n] / 1e9:.0f}" if fl else ""
    print(f"| {n} | {med[n] * 1e3:.2f} | {cnt} | {per * 1e3:.0f} | {per / step:.2f} | {gf} |")
pym = {k: statistics.median(p.get(k, 0.0) for p in py[1:]) for k in py[-1]}
build = pym.get("graph build (forward, lazy)", 0.0) + pym.get("numpy step inputs", 0.0)
other = step - pym.get("eval (compute) + sampling", 0.0) - build - pym.get("scheduler", 0.0)
for n, s in [("Python: scheduler", pym.get("scheduler", 0.0)),
             ("Python: numpy inputs + graph build", build),
             ("Python: rest of step (detokenizer, outputs)", other)]:
    total += s
    print(f"| {n} | | 1 | {s * 1e3:.0f} | {s / step:.2f} | |")
print(f"| **sum of categories** | | | {total * 1e3:.0f} | {total / step:.2f} | |")
print(f"| measured step | | | {step * 1e3:.0f} | 1.00 | |")
for n, (_, cnt) in WHOLE.items():
    print(f"{n}: {med[n] * 1e3:.2f} ms x {cnt} = {med[n] * cnt * 1e3:.0f} ms")
mm = sum(fl * cnt for _, cnt, fl in CATS.values())
print(f"matmul FLOPs per step {mm / 1e9:.2f} GFLOP: {mm / rate:.3f} s at the 2048^3 rate "
      f"= {mm / rate / step:.2f} of the step")
