"""Speculative decoding's outputs against the same engine without it, on the text workloads.

For each workload, ``--num-prompts`` rows run through ``LLM.generate`` without speculation
and with ``--speculative-config``: greedy (top-2 log-probabilities kept on the plain run), then
sampled at temperature 0.8 with a seed per row. A greedy row that differs is counted as a tie
when the plain run's top two log-probabilities at the first differing token lie within
``--tie`` of each other (the verify forward's different batch shape may then flip the argmax),
otherwise as a mismatch; a sampled row that differs is counted (float noise in the verify
forward can move a drawn token). ``--max-num-seqs`` is small so the gate drafts. Writes a
JSON summary.

    python benchmarks/spec_identity.py --num-prompts 24 --json benchmarks/results/spec_identity.json
"""

from __future__ import annotations

import argparse
import json
import time

from mlxpa import LLM, SamplingParams
from mlxpa.bench.text_workloads import TEXT_WORKLOADS, text_prompts


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (one ending early counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(logprobs: dict) -> float:
    """The gap between the two largest log-probabilities of one position's entries."""
    values = sorted((lp.logprob for lp in logprobs.values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--workloads", nargs="*", default=list(TEXT_WORKLOADS))
    ap.add_argument("--speculative-config",
                    default='{"method": "suffix", "num_speculative_tokens": 4}')
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--tie", type=float, default=1e-4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    spec = json.loads(args.speculative_config)
    engine = dict(max_num_seqs=args.max_num_seqs, kv_cache_memory_bytes=1 << 30)
    plain = LLM(args.model, **engine)
    fast = LLM(args.model, **engine, speculative_config=spec)
    summary = {"speculative_config": spec, "num_prompts": args.num_prompts,
               "max_num_seqs": args.max_num_seqs, "tie": args.tie, "workloads": {}}
    for name in args.workloads:
        rows = text_prompts(name, args.num_prompts)
        prompts = [r.text for r in rows]
        result = {}
        for kind in ("greedy", "seeded"):
            params = [SamplingParams(max_tokens=r.max_tokens, stop=list(r.stop),
                                     **({"logprobs": 2} if kind == "greedy" else
                                        {"temperature": 0.8, "seed": i}))
                      for i, r in enumerate(rows)]
            t0 = time.perf_counter()
            want = plain.generate(prompts, params, use_tqdm=False)
            t1 = time.perf_counter()
            c0 = fast.llm_engine.counters
            before = (c0.spec.num_draft_tokens, c0.spec.num_accepted_tokens)
            got = fast.generate(prompts, params, use_tqdm=False)
            t2 = time.perf_counter()
            c = fast.llm_engine.counters
            if c is not c0:  # each call may start fresh counters
                before = (0, 0)
            same = ties = mismatches = 0
            for w, g in zip(want, got):
                a, b = w.outputs[0], g.outputs[0]
                i = first_difference(a.token_ids, b.token_ids)
                if i is None and a.text == b.text:
                    same += 1
                elif kind == "greedy" and i is not None and i < len(a.logprobs) \
                        and top2_gap(a.logprobs[i]) <= args.tie:
                    ties += 1
                else:
                    mismatches += 1
            result[kind] = {
                "rows": len(rows), "identical": same, "ties": ties, "differ": mismatches,
                "output_tokens": sum(len(o.outputs[0].token_ids) for o in want),
                "plain_s": t1 - t0, "spec_s": t2 - t1,
                "draft_tokens": c.spec.num_draft_tokens - before[0],
                "accepted_tokens": c.spec.num_accepted_tokens - before[1]}
            print(name, kind, result[kind], flush=True)
        summary["workloads"][name] = result
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
