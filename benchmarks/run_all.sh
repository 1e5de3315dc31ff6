#!/usr/bin/env bash
# The benchmark runs behind docs/performance.md's results tables (default model, this CPU).
# Static allocation runs one request at a time (a few tokens/s here), so on the random
# workload it is timed on its own 16-prompt draw (same generator and parameters, seed 0); its
# throughput does not depend on how many requests follow each other.
# The last two runs use MLX's bundled reference BLAS (about 6 GFLOP/s here, 30x slower
# matmuls), on smaller workloads of the same shapes so that they finish in minutes.
set -euo pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
mlxpa bench --workload shared-prefix --num-groups 8 --prompts-per-group 16 \
  --system-prompt-len 512 --question-len 64 --output-len 32 \
  --baselines mlxpa,mlx-lm,static --json "$out/shared_prefix.json" --plot "$out/shared_prefix.png"
mlxpa bench --workload random --num-prompts 128 --input-len 320 --range-ratio 0.6 \
  --output-len 64 --baselines mlxpa,mlx-lm --json "$out/random.json" --plot "$out/random.png"
mlxpa bench --workload random --num-prompts 16 --input-len 320 --range-ratio 0.6 \
  --output-len 64 --baselines mlxpa,static --json "$out/random_static.json"
mlxpa bench --blas bundled --workload shared-prefix --num-groups 2 --prompts-per-group 4 \
  --system-prompt-len 512 --question-len 64 --output-len 32 \
  --baselines mlxpa,mlx-lm,static --json "$out/shared_prefix_bundled.json"
mlxpa bench --blas bundled --workload random --num-prompts 8 --input-len 320 --range-ratio 0.6 \
  --output-len 64 --baselines mlxpa,mlx-lm,static --json "$out/random_bundled.json"
