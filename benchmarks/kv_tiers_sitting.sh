#!/usr/bin/env bash
# The KV tiers sitting (a pool that follows the load, the disk tier), every figure of
# docs/performance.md's "KV memory in tiers" section, on a quiet machine:
#   OLD=/path/to/a/checkout/before bash benchmarks/kv_tiers_sitting.sh [pool|disk|same]
# OLD (for `same` only) is the tree the ratios compare with (git worktree add --detach
# ../before41 9b08039: the tree before cache_salt, the disk tier and the growing pool).
set -euo pipefail
cd "$(dirname "$0")"
R=results
NEW=$(cd .. && pwd)
steps=${*:-pool disk same}
for step in $steps; do
  echo "== $step: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  case $step in
    pool)  # serve RSS against the smallest pool; c16 tok/s against the preallocated pool
      PYTHONPATH=$NEW python kv_pool_rss.py --parts rss,timing --repeats 3 \
        --json $R/kv_pool_rss.json ;;
    disk)  # 20 runs sharing a 4,096-token prefix; a restarted server; read vs compute a block
      PYTHONPATH=$NEW python kv_disk_tier.py --pipeline --server --block-costs \
        --json $R/kv_disk_tier.json ;;
    same)  # the default model's shared-prefix and random benches, both trees
      OLD=${OLD:?set OLD to a checkout of the tree before}
      PYTHONPATH=$NEW python workload_file.py /tmp/sp.jsonl --workload shared-prefix
      PYTHONPATH=$NEW python workload_file.py /tmp/random.jsonl --workload random
      for wl in sp random; do
        python tree_bench.py /tmp/$wl.jsonl --repeats ${REPEATS:-2} \
          --json $R/kv_tiers_same_$wl.json --runs "mlxpa=$NEW,before=$OLD"
      done ;;
    *) echo "unknown step $step (pool, disk, same)" >&2; exit 2 ;;
  esac
done
