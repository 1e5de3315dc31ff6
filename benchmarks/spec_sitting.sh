#!/usr/bin/env bash
# Speculative decoding's sitting: docs/speculative-decoding.md's figures, each ratio's systems
# in one run (mlxpa with --speculative-config against mlxpa-nospec, the same engine without):
#   serve     mlxpa serve, copy-heavy text rows (code editing, quoting QA, summarising) as
#             chat requests, 1 and 16 streaming clients
#   shared    the shared-prefix serve workload at 16 clients, with mlx_lm.server
#   offline   mlxpa bench, 128 rows of each text workload
#   small     mlxpa bench, 8 copy-heavy rows, 3 repeats
#   identity  benchmarks/spec_identity.py: greedy and seeded texts with speculation on and off
# Usage: bash benchmarks/spec_sitting.sh [STEP...] (default: every step, in that order), alone
# on a quiet machine, with the virtual environment active; SPEC overrides the config.
set -euo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
spec=${SPEC:-'{"method": "suffix", "num_speculative_tokens": 4}'}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(serve shared offline small identity)
for step in "${steps[@]}"; do
  echo "== $step: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  case $step in
    serve)
      mlxpa bench serve --workload copy-heavy --num-prompts 24 --concurrency 1,16 \
        --endpoint chat --baselines mlxpa,mlxpa-nospec --speculative-config "$spec" --kv-memory 1 -q \
        --json "$out/spec_serve_copy_heavy.json" ;;
    shared)
      mlxpa bench serve --workload shared-prefix --prompts-per-group 48 --system-prompt-len 512 \
        --question-len 32 --output-len 32 --concurrency 16 --endpoint chat \
        --baselines mlxpa,mlxpa-nospec,mlx-lm-server --speculative-config "$spec" \
        --kv-memory 1 -q --json "$out/spec_serve_shared_prefix.json" ;;
    offline)
      for wl in extraction summarise code-edit quote-qa labelling continue; do
        mlxpa bench --workload "$wl" --num-prompts 128 --baselines mlxpa,mlxpa-nospec \
          --speculative-config "$spec" -q --json "$out/spec_offline_$wl.json"
      done ;;
    small)
      mlxpa bench --workload copy-heavy --num-prompts 8 --baselines mlxpa,mlxpa-nospec \
        --speculative-config "$spec" --repeats 3 -q --json "$out/spec_offline_copy_heavy_8.json" ;;
    identity)
      python benchmarks/spec_identity.py --num-prompts 12 --speculative-config "$spec" \
        --json "$out/spec_identity.json" ;;
    *)
      echo "unknown step $step (serve, shared, offline, small, identity)" >&2; exit 2 ;;
  esac
done
