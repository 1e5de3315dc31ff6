"""Prefill and decode against the matmul limit on whichever mlxpa ``PYTHONPATH`` selects
(the same measurement as ``mlxpa bench --workload limits``, usable on an older checkout that
has ``mlxpa/bench/flops.py`` and ``limits.py`` copied in): one process, default model.

    PYTHONPATH=<checkout> python benchmarks/limits_check.py [repeats]
"""

import sys

from mlxpa.bench.flops import model_flops
from mlxpa.bench.limits import gemm_flops_per_s, run_limits
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model

model, tok, _ = load_model(EngineConfig())
flops = model_flops(model)
rate = gemm_flops_per_s()
rows = run_limits(model, tok, EngineConfig(), flops, rate, int(sys.argv[1]) if len(sys.argv) > 1
                  else 1)
print(f"GEMM {rate / 1e9:.1f} GFLOP/s; {flops.prefill / 1e9:.3f} / {flops.decode / 1e9:.3f} "
      "GFLOP per prefill / decode token")
for r in rows:
    print(f"{r.phase}: {r.tokens} tokens in {r.seconds:.2f} s = {r.tokens_per_s:.1f} tok/s; "
          f"limit {r.limit_tokens_per_s:.1f} tok/s; fraction {r.fraction:.2f}")
