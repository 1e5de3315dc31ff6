"""The shared-prefix workload with prefix caching on and off.

8 groups x 16 prompts, each group sharing a 512-token system prompt, 64-token questions,
32 greedy output tokens (EOS ignored), on the default model. Prints the prefix cache hit rate,
the fraction of prompt tokens computed, peak KV blocks of both runs and whether every output is
identical, and writes them as JSON.

    python benchmarks/shared_prefix_check.py [--json shared_prefix_check.json]
"""

from __future__ import annotations

import argparse
import json
import time

from mlxpa.bench.workloads import shared_prefix_workload
from mlxpa.config import EngineConfig
from mlxpa.core.prefix_order import prefix_order
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import summarize
from mlxpa.loader.models import load_model
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams


def run(model, tok, wl, prefix_caching: bool) -> tuple[dict, dict]:
    config = EngineConfig(enable_prefix_caching=prefix_caching)
    engine = LLMEngine(config, model, tok)
    order = prefix_order(wl.prompts, config.block_size) if prefix_caching else range(
        len(wl.prompts))
    items = [EngineRequest(str(i), wl.prompts[i], SamplingParams(max_tokens=wl.output_lens[i],
                                                           ignore_eos=True)) for i in order]
    engine.counters.start_time = time.perf_counter()
    outs = {int(o.request_id): o.token_ids for o in engine.generate(items)}
    s = summarize(engine.counters)
    computed = s.prompt_tokens - s.cached_prompt_tokens
    return outs, {"prefix_cache_hit_rate": s.prefix_cache_hit_rate,
                  "prompt_tokens": s.prompt_tokens, "computed_prompt_tokens": computed,
                  "computed_fraction": computed / s.prompt_tokens,
                  "peak_kv_blocks": s.peak_kv_blocks, "elapsed_s": s.elapsed_s,
                  "total_tokens_per_s": s.total_tokens_per_s,
                  "output_tokens_per_s": s.output_tokens_per_s,
                  "kv_utilization": s.kv_utilization, "evicted_blocks": s.evicted_blocks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, tok, _ = load_model(EngineConfig())
    wl = shared_prefix_workload(tok, 8, 16, 512, 64, 32)
    on_out, on = run(model, tok, wl, True)
    off_out, off = run(model, tok, wl, False)
    result = {"prefix_caching": on, "no_prefix_caching": off,
              "peak_kv_blocks_ratio": on["peak_kv_blocks"] / off["peak_kv_blocks"],
              "outputs_identical": on_out == off_out,
              "num_rows_differing": sum(on_out[k] != off_out[k] for k in on_out)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
