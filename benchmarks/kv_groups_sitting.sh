#!/usr/bin/env bash
# The KV cache groups sitting (sliding windows and recurrent snapshots), every figure of
# docs/performance.md's "KV cache groups" section, on a quiet machine:
#   OLD=/path/to/a/checkout/before bash benchmarks/kv_groups_sitting.sh [memory|long|hybrid|same]
# OLD is the tree the ratios compare with (git worktree add --detach ../old bbde60b);
# each system runs in a process of its own (its peak RSS), trees alternating.
set -euo pipefail
cd "$(dirname "$0")"
R=results
OLD=${OLD:?set OLD to a checkout of the tree before}
NEW=$(cd .. && pwd)
steps=${*:-memory long hybrid same}
for step in $steps; do
  case $step in
    memory)  # one 8k and one 32k prompt: mlxpa's KV at peak against mlx-lm's prompt cache
      PYTHONPATH=$NEW python kv_window_memory.py --lengths 8192,32767 \
        --json $R/kv_window_memory.json ;;
    long)  # 16 documents of 8,192 tokens, a 256-token summary each, --kv-memory 1
      PYTHONPATH=$NEW python workload_file.py /tmp/long_docs.jsonl --workload long-document \
        --num-prompts 16 --input-len 8192 --output-len 256
      python tree_bench.py /tmp/long_docs.jsonl --json $R/long_documents.json \
        --runs "mlxpa=$NEW,before=$OLD,mlx-lm=$NEW:mlx-lm" -- --kv-memory 1
      # the same documents, 5 typed questions each instead of a summary
      PYTHONPATH=$NEW python -m mlxpa bench --workload long-document --questions 5 \
        --num-prompts 16 --input-len 8192 --baselines mlxpa --kv-memory 1 -q \
        --json $R/long_documents_questions.json ;;
    hybrid)  # a random Qwen 3.5 (340M): 8 x 16 rows sharing 512 tokens; n = 4 rows
      [ -d /tmp/qwen35 ] || PYTHONPATH=$NEW python hybrid_model.py /tmp/qwen35
      PYTHONPATH=$NEW python workload_file.py /tmp/hybrid_sp.jsonl --model /tmp/qwen35 \
        --workload shared-prefix --num-groups 8 --prompts-per-group 16 \
        --system-prompt-len 512 --question-len 64 --output-len 32
      python tree_bench.py /tmp/hybrid_sp.jsonl --model /tmp/qwen35 \
        --json $R/hybrid_shared_prefix.json --runs "mlxpa=$NEW,before=$OLD"
      for tree in $NEW $OLD; do
        PYTHONPATH=$tree python hybrid_samples.py --model /tmp/qwen35
      done | tee $R/hybrid_samples.jsonl ;;
    same)  # the default model's shared-prefix and random benches, both trees, 3 repeats
      PYTHONPATH=$NEW python workload_file.py /tmp/sp.jsonl --workload shared-prefix
      PYTHONPATH=$NEW python workload_file.py /tmp/random.jsonl --workload random
      for wl in sp random; do
        python tree_bench.py /tmp/$wl.jsonl --repeats ${REPEATS:-3} --json $R/kv_groups_same_$wl.json \
          --runs "mlxpa=$NEW,before=$OLD"
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
