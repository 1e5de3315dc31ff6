"""Float32 GEMM rate at Gemma 3 270M's own matmul shapes against the 2048^3 product that
``mlxpa bench --workload limits`` uses, interleaved in one process (one round times every
shape once), medians over rounds; on a shared machine read the ratio column:

    python benchmarks/gemm_shapes.py [rounds]      # default 7

Shapes (M, K, N) as ``x[M, K] @ w[N, K].T`` (mlx-lm's ``nn.Linear``): prefill 2,048 tokens
(4 x 512) and decode 128 rows, q/k/v (N = 1024 + 256 + 256 in three products), o, gate/up,
down, the 262,144-token LM head (decode: 128 rows; prefill: the 4 sampled rows).
"""

import statistics
import sys
import time

import mlx.core as mx

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
HIDDEN, HEADS_DIM, KV_DIM, INTER, VOCAB = 640, 1024, 256, 2048, 262144
SHAPES = {"2048^3 (reference)": [(2048, 2048, 2048)]}
for phase, m in (("prefill", 2048), ("decode", 128)):
    SHAPES[f"{phase} q/k/v"] = [(m, HIDDEN, HEADS_DIM), (m, HIDDEN, KV_DIM), (m, HIDDEN, KV_DIM)]
    SHAPES[f"{phase} o"] = [(m, HEADS_DIM, HIDDEN)]
    SHAPES[f"{phase} gate/up"] = [(m, HIDDEN, INTER)] * 2
    SHAPES[f"{phase} down"] = [(m, INTER, HIDDEN)]
SHAPES["prefill LM head (4 rows)"] = [(4, HIDDEN, VOCAB)]
SHAPES["decode LM head (128 rows)"] = [(128, HIDDEN, VOCAB)]
ARRAYS = {}
for name, shapes in SHAPES.items():
    ARRAYS[name] = [(mx.random.normal((m, k)), mx.random.normal((n, k))) for m, k, n in shapes]
    mx.eval(ARRAYS[name])
times = {name: [] for name in SHAPES}
for _ in range(ROUNDS + 1):
    for name, pairs in ARRAYS.items():
        t0 = time.perf_counter()
        mx.eval([x @ w.T for x, w in pairs])
        times[name].append(time.perf_counter() - t0)
rates = {name: sum(2 * m * k * n for m, k, n in SHAPES[name]) / statistics.median(t[1:])
         for name, t in times.items()}
ref = rates["2048^3 (reference)"]
print("| shape | GFLOP/s | ratio to 2048^3 |")
print("|---|---|---|")
for name, r in rates.items():
    print(f"| {name} | {r / 1e9:.1f} | {r / ref:.2f} |")
