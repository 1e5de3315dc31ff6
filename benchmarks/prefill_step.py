"""Time one prefill step of the default model (``B`` prompts of ``L`` random tokens, one
engine step) with the CPU prefill changes switched off one by one, interleaved in one process,
medians over repeats:

- ``untiled``: attention over all keys at once, MLP whole, one CPU stream;
- ``tiles``: query tiles of 64 rows over their key ranges, one stream;
- ``tiles+streams``: tiles alternating between two CPU streams, MLP row halves on both, the
  fused activations compiled ``shapeless`` (before the per-shape compile);
- ``now``: the same with the activations compiled per input shape.

    python benchmarks/prefill_step.py [B] [L] [repeats]     # default 4 512 5
"""

import statistics
import sys
import time

import mlx.core as mx

from mlxpa.bench.flops import model_flops
from mlxpa.bench.limits import gemm_flops_per_s
from mlxpa.bench.workloads import random_workload
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.kernels import cpu_fused, cpu_paged_attention, cpu_streams
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams

B, L, REPEATS = (int(a) for a in (sys.argv[1:] + ["4", "512", "5"][len(sys.argv) - 1:]))
model, tok, _ = load_model(EngineConfig())
wl = random_workload(tok, B, L, 1, 0.0)
streams = cpu_streams.cpu_streams()[:]
VARIANTS = {"untiled": (1 << 30, 1 << 30, 1, True), "tiles": (64, 1 << 30, 1, True),
            "tiles+streams": (64, 256, 2, True), "now": (64, 256, 2, False)}
GELU = {False: cpu_fused.gelu_tanh,
        True: mx.compile(lambda x: 0.5 * x * (1.0 + cpu_fused._tanh(
            cpu_fused._SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))), shapeless=True)}


def step_seconds(tile: int, split_rows: int, num_streams: int, shapeless: bool) -> float:
    cpu_paged_attention.QUERY_TILE, cpu_streams.MIN_SPLIT_ROWS = tile, split_rows
    cpu_fused._FastNN.gelu_approx = staticmethod(GELU[shapeless])
    cpu_streams._LOCAL.streams = streams[:num_streams]
    engine = LLMEngine(EngineConfig(kv_cache_memory_bytes=2**29, max_num_batched_tokens=B * L),
                       model, tok)
    for i, p in enumerate(wl.prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    engine.step()
    return time.perf_counter() - t0


step_seconds(*VARIANTS["now"])
times = {k: [] for k in VARIANTS}
for _ in range(REPEATS):
    for k, v in VARIANTS.items():
        times[k].append(step_seconds(*v))
f, rate = model_flops(model), gemm_flops_per_s()
limit = (B * L * f.prefill + B * f.head) / rate
print(f"{B} x {L} tokens; GEMM {rate / 1e9:.1f} GFLOP/s; matmul limit {limit:.3f} s")
for k, v in times.items():
    m = statistics.median(v)
    print(f"{k:14s} {m:.3f} s  {B * L / m:7.1f} tok/s  {limit / m:.2f} of the limit")
