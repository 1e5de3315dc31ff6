"""KV memory of one long prompt: mlxpa's KV cache groups against mlx-lm's own prompt cache.

For each length, one prompt of that many tokens (a text tokenized and repeated) runs in both:

- mlx-lm: ``generate_step`` with the model's ``make_prompt_cache`` (its sliding-window layers
  in ``RotatingKVCache``), one token generated; the cache's ``nbytes`` after it;
- mlxpa: ``LLMEngine`` with a pool that holds the prompt, one token generated; the peak KV
  bytes held by the request at any step (``Counters.peak_kv_bytes``: the blocks it held in
  every group, prefill chunks included) and per group.

Both first tokens must agree (the same greedy token). The default model is Gemma 3 270M
(18 layers, 15 of them with a 512-token window).

    python benchmarks/kv_window_memory.py [--model FOLDER] [--lengths 8192,32767]
        [--json benchmarks/results/kv_window_memory.json]
"""

from __future__ import annotations

import argparse
import json
import time

TEXT = ("A paged KV cache keeps keys and values in fixed blocks; a sliding-window layer reads "
        "only the last tokens of its window, so its older blocks can go back to the pool. ")


def prompt(tok, length: int) -> list[int]:
    ids = tok.encode(TEXT * (length // 20 + 1))
    return ids[:length]


def mlx_lm_cache(model, ids: list[int]) -> tuple[int, int, float]:
    """``(first token, cache nbytes, seconds)`` of mlx-lm's own generation of one token."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start = time.perf_counter()
    token, _ = next(generate_step(mx.array(ids), model, max_tokens=1, prompt_cache=cache))
    mx.eval(*[c.state for c in cache])
    return int(token), sum(c.nbytes for c in cache), time.perf_counter() - start


def mlxpa_cache(model, tok, ids: list[int]) -> tuple[int, dict, float]:
    """``(first token, figures, seconds)`` of mlxpa's engine generating one token."""
    from mlxpa.config import EngineConfig
    from mlxpa.engine import LLMEngine
    from mlxpa.request import EngineRequest
    from mlxpa.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(), model, tok, expected_requests=[(len(ids), 1, 1)])
    start = time.perf_counter()
    (out,) = engine.generate([EngineRequest("0", ids, SamplingParams(max_tokens=1))])
    seconds = time.perf_counter() - start
    c, r = engine.counters, engine.runner
    return out.token_ids[0], {
        "peak_kv_bytes": c.peak_kv_bytes,
        "peak_kv_bytes_by_group": dict(c.peak_kv_bytes_by_group),
        "pool_blocks": r.num_blocks - 1, "block_bytes": r.block_bytes,
        "pool_bytes": (r.num_blocks - 1) * r.block_bytes,
        "layout": r.kv_storage.describe()}, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lengths", default="8192,32767")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import mlxpa  # noqa: F401 - the fast BLAS before mlx
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    model, tok, _ = load_model(EngineConfig(model=args.model))
    runs = []
    for length in map(int, args.lengths.split(",")):
        ids = prompt(tok, length)
        ref_token, ref_bytes, ref_s = mlx_lm_cache(model, ids)
        token, figures, s = mlxpa_cache(model, tok, ids)
        run = {"prompt_tokens": len(ids), "mlx_lm_cache_bytes": ref_bytes,
               "mlx_lm_s": round(ref_s, 1), "mlxpa_s": round(s, 1),
               "same_first_token": token == ref_token, **figures,
               "ratio": figures["peak_kv_bytes"] / ref_bytes}
        runs.append(run)
        print(f"{len(ids):>6} tokens: mlxpa {figures['peak_kv_bytes'] / 2**20:,.1f} MiB at peak "
              f"({', '.join(f'{k} {v / 2**20:,.1f}' for k, v in run['peak_kv_bytes_by_group'].items())}), "  # noqa: E501
              f"mlx-lm {ref_bytes / 2**20:,.1f} MiB: {run['ratio']:.3f}x; "
              f"same first token: {run['same_first_token']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model or "default", "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
