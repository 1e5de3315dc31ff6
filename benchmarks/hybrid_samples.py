"""``n = 4`` samples of each prompt on a hybrid model: prompt tokens computed and time.

With recurrent snapshots the first sample saves its state before its last prompt token and
the other samples restore it, so a row's prompt is computed once (plus one token per further
sample); without, each sample computes the whole prompt. Runs in whichever tree
``PYTHONPATH`` names; prints one JSON line.

    PYTHONPATH=TREE python benchmarks/hybrid_samples.py --model FOLDER [--rows 8
        --prompt-len 576 --n 4 --max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=576)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    import numpy as np

    import mlxpa
    from mlxpa.config import EngineConfig
    from mlxpa.engine import LLMEngine
    from mlxpa.loader.models import load_model
    from mlxpa.sampling_params import SamplingParams

    config = EngineConfig(model=args.model)
    model, tok, _ = load_model(config)
    rng = np.random.default_rng(0)
    prompts = [[2] + rng.integers(3, 32000, args.prompt_len - 1).tolist()
               for _ in range(args.rows)]
    engine = LLMEngine(config, model, tok, kv_blocks_needed=4000)
    computed = [0]
    schedule = engine.scheduler.schedule

    def counting():
        out = schedule()
        computed[0] += sum(max(0, min(r.num_computed_tokens + n, r.num_prompt_tokens)
                               - r.num_computed_tokens)
                           for r, n in zip(out.requests, out.num_scheduled_tokens))
        return out

    engine.scheduler.schedule = counting
    params = SamplingParams(max_tokens=args.max_tokens, n=args.n, temperature=0.8, seed=1,
                            ignore_eos=True)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    print(json.dumps({"tree": mlxpa.__file__, "rows": args.rows, "n": args.n,
                      "prompt_tokens": sum(map(len, prompts)),
                      "prompt_tokens_computed": computed[0],
                      "samples": len(outs), "elapsed_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
