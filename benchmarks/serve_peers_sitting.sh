#!/usr/bin/env bash
# The serving sittings on equal terms (every server on the bench's BLAS, the same token ids,
# warmed up until it generates, chat and completions), each ratio's systems in one run:
#   peers    mlxpa, mlx_lm.server and llama.cpp's llama-server at 1 and 16 clients on the
#            shared-prefix workload (48 requests, 512-token prefix, 32 output tokens), both
#            endpoints: docs/serve-bench.md's llama.cpp section
#   serve    the table of docs/serve.md and the README (c=1,8,16,32, with mlxpa-offline)
#   poisson  mlxpa under Poisson arrivals (docs/serve.md)
#   offline  benchmarks/run_all.sh: docs/performance.md's tables and the README's
# Usage: LLAMA_SERVER=/path/to/llama-server bash benchmarks/serve_peers_sitting.sh [STEP...]
# (default: every step, in the order above). Run it alone on a quiet machine, from a plain
# shell (no LD_PRELOAD: the bench gives its servers the BLAS itself), with the virtual
# environment active; each step prints the load average before it starts.
set -euo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(peers serve poisson offline)
shape=(--workload shared-prefix --prompts-per-group 48 --system-prompt-len 512
       --question-len 32 --output-len 32)
for step in "${steps[@]}"; do
  echo "== $step: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  case $step in
    peers)
      mlxpa bench serve "${shape[@]}" --concurrency 1,16 \
        --baselines mlxpa,mlx-lm-server,llama-server --llama-server "${LLAMA_SERVER:?}" \
        --json "$out/serve_peers.json" --plot "$out/serve_peers.png" ;;
    serve)
      mlxpa bench serve "${shape[@]}" --concurrency 1,8,16,32 \
        --baselines mlxpa,mlx-lm-server,mlxpa-offline \
        --json "$out/serve_shared_prefix.json" --plot "$out/serve_shared_prefix.png" ;;
    poisson)
      mlxpa bench serve "${shape[@]}" --request-rate 0.5,1 --concurrency 16 --baselines mlxpa \
        --json "$out/serve_poisson.json" ;;
    offline)
      bash benchmarks/run_all.sh "$out" ;;
    *)
      echo "unknown step $step (peers, serve, poisson, offline)" >&2; exit 2 ;;
  esac
done
