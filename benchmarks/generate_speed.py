"""``LLM.generate`` on a list of strings, timed in two source trees (this one and an older
commit checked out elsewhere) on the same prompts: is the Python API's path as fast as it was?

Each tree runs in a fresh process with ``PYTHONPATH`` pointing at it: ``LLM(model)`` (not
timed), one warm-up call, then ``generate(prompts, SamplingParams(temperature=0, max_tokens=N,
ignore_eos=True))`` timed by wall clock around the call. Rounds alternate the trees' order.
The prompts are the bench's ``random`` workload decoded to text, written once and read by
both. Printed (and written to ``--json``): per tree each round's output tok/s, the median, the
ratio to the first tree, and whether every text equals the first tree's.

    git worktree add --detach /tmp/old 7f14f1f
    python benchmarks/generate_speed.py --trees .,/tmp/old --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
from mlxpa import LLM, SamplingParams
spec = json.load(open(sys.argv[1]))
llm = LLM(spec["model"])
params = SamplingParams(temperature=0.0, max_tokens=spec["output_len"], ignore_eos=True)
llm.generate(spec["prompts"][:4], params)
start = time.perf_counter()
outs = llm.generate(spec["prompts"], params)
seconds = time.perf_counter() - start
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
print("RESULT " + json.dumps({"seconds": seconds, "output_tokens": tokens,
                              "texts": [o.outputs[0].text for o in outs]}))
"""


def run_tree(tree: str, spec_path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, spec_path], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", default=".", help="comma-separated source trees")
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from mlxpa.bench.workloads import random_workload
    from mlxpa.loader.models import load_tokenizer_of, resolve_model

    model = str(resolve_model(args.model))
    tok = load_tokenizer_of(model)
    wl = random_workload(tok, args.num_prompts, args.input_len, args.output_len)
    prompts = [tok.decode(ids[1:] if ids[0] == tok.bos_token_id else ids) for ids in wl.prompts]
    trees = args.trees.split(",")
    rounds: dict[str, list[float]] = {t: [] for t in trees}
    texts: dict[str, list[str]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"model": model, "prompts": prompts, "output_len": args.output_len}, f)
    for r in range(args.repeats):
        for tree in (trees if r % 2 == 0 else trees[::-1]):
            res = run_tree(tree, f.name)
            rounds[tree].append(res["output_tokens"] / res["seconds"])
            texts.setdefault(tree, res["texts"])
            print(f"round {r} {tree}: {rounds[tree][-1]:.1f} out tok/s", flush=True)
    os.unlink(f.name)
    first = trees[0]
    report = {"num_prompts": args.num_prompts, "input_len": args.input_len,
              "output_len": args.output_len, "trees": {}}
    for tree in trees:
        med = statistics.median(rounds[tree])
        report["trees"][tree] = {
            "out_tok_s": [round(x, 1) for x in rounds[tree]], "median": round(med, 1),
            "ratio_to_first": round(med / statistics.median(rounds[first]), 3),
            "texts_equal_first": texts[tree] == texts[first]}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
