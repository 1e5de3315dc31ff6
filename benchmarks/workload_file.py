"""Write one of ``mlxpa bench``'s synthetic workloads as a JSONL file of token-id rows
(``prompt_token_ids``, ``max_tokens``), so that two trees, or two systems, time the very same
prompts through ``mlxpa bench --workload file``.

    python benchmarks/workload_file.py OUT.jsonl --workload shared-prefix [--model FOLDER]
        [--num-prompts 128 --input-len 320 --output-len 64 --num-groups 8
         --prompts-per-group 16 --system-prompt-len 512 --question-len 64 --seed 0]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--workload", default="random")
    ap.add_argument("--model", default=None)
    for name, default in (("num_prompts", 128), ("input_len", 320), ("output_len", 64),
                          ("num_groups", 8), ("prompts_per_group", 16),
                          ("system_prompt_len", 512), ("question_len", 64), ("seed", 0)):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    ap.add_argument("--range-ratio", type=float, default=0.6)
    args = ap.parse_args()

    import mlxpa  # noqa: F401 - the fast BLAS before mlx
    from mlxpa.batch.model_meta import ModelMeta
    from mlxpa.bench.workloads import make_workload
    from mlxpa.config import EngineConfig

    tokenizer = ModelMeta(EngineConfig(model=args.model)).tokenizer()
    shape = {k: getattr(args, k) for k in ("num_prompts", "input_len", "range_ratio",
                                           "output_len", "num_groups", "prompts_per_group",
                                           "system_prompt_len", "question_len")}
    wl = make_workload(args.workload, tokenizer, **shape, seed=args.seed)
    with open(args.out, "w") as f:
        for i, (ids, n) in enumerate(zip(wl.prompts, wl.output_lens)):
            f.write(json.dumps({"id": i, "prompt_token_ids": ids, "max_tokens": n}) + "\n")
    print(f"wrote {args.out}: {wl.name}, {len(wl.prompts)} prompts, {wl.num_prompt_tokens} "
          f"prompt tokens, {wl.num_output_tokens} output tokens")


if __name__ == "__main__":
    main()
