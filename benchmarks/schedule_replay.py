"""Replay the scheduler on a workload file without the forward pass: the default model's KV
layout and pool under ``--kv-memory``, every request running to its ``max_tokens`` (a fake
token per sampling request, EOS ignored), and what the steps would be: preemptions, requests
running at once, prefill tokens computed (a recompute counts again), decode-only steps by
rows. Seconds, not a timing: use it to see what an admission rule does before a sitting.

    python benchmarks/schedule_replay.py /tmp/long_docs.jsonl --kv-memory 1 [--vllm-admission]

``--vllm-admission`` starts a fresh request whenever its first chunk fits (vLLM's rule, the
scheduler's before the admission reserve for long prompts); a preempted one still waits for
room to finish.
"""

from __future__ import annotations

import argparse
import collections
import json

from mlxpa.config import EngineConfig
from mlxpa.core.scheduler import Scheduler
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("file", help="JSONL rows with prompt_token_ids and max_tokens")
ap.add_argument("--kv-memory", type=float, default=1.0, help="GiB")
ap.add_argument("--vllm-admission", action="store_true")
args = ap.parse_args()

if args.vllm_admission:
    Scheduler._waits_for_room = lambda self, req, cached: bool(req.num_preemptions)
config = EngineConfig(kv_cache_memory_bytes=int(args.kv_memory * 2**30))
model, tokenizer, _ = load_model(config)
engine = LLMEngine(config, model, tokenizer)
with open(args.file) as f:
    for line in f:
        row = json.loads(line)
        engine.add_request(str(row.get("id")), row["prompt_token_ids"],
                           SamplingParams(max_tokens=row["max_tokens"], ignore_eos=True))
sched = engine.scheduler
steps = peak = prompt_computed = 0
decode_only: collections.Counter[int] = collections.Counter()
while sched.has_unfinished_requests():
    out = sched.schedule()
    steps += 1
    peak = max(peak, len(sched.running))
    prompt_computed += sum(n for r, n in zip(out.requests, out.num_scheduled_tokens)
                           if r.num_computed_tokens < r.num_prompt_tokens)
    if all(n == 1 for n in out.num_scheduled_tokens):
        decode_only[len(out.requests)] += 1
    sched.update_from_output(out, [[7] for s in out.sampling if s])
print(f"{args.file} at --kv-memory {args.kv_memory}"
      f"{' (vLLM admission)' if args.vllm_admission else ''}: {steps} steps, "
      f"{sched.num_preemptions} preemptions, peak running {peak}, "
      f"{prompt_computed:,} prefill tokens computed")
print("decode-only steps by rows:", dict(sorted(decode_only.items())))
