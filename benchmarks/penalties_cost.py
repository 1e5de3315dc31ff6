"""What ``logit_bias`` and the repetition, presence and frequency penalties cost on a decode
step where every row sets them.

Two engines over the same model and prompts, both with every row decoding: ``plain`` (no
row sets anything) and ``penalised`` (every row sets ``repetition_penalty``,
``presence_penalty``, ``frequency_penalty`` and a ``logit_bias`` of a few ids; the
repetition penalty makes each row touch every distinct token of its prompt and output).
Steps of the two alternate in one process, so machine noise hits both alike; the script
prints the median step of each and the difference as a fraction of the plain step. It also
times the penalty work alone at the step's real shapes (the host entries of
``PenaltyState.step``, the gather evaluated, the penalised scatter and the argmax against
the argmax alone), as a second estimate that whole-step noise does not blur.

    python benchmarks/penalties_cost.py                       # default model, 128 rows
    python benchmarks/penalties_cost.py --rows 128 --prompt-len 256 --rounds 30
    python benchmarks/penalties_cost.py --tiny --rows 8 --rounds 3   # a quick check
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxpa.bench.workloads import random_workload
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.penalties import PenaltyState, apply_penalties, gather_entries


def penalised_params(max_tokens: int, vocab: int) -> SamplingParams:
    ids = np.random.default_rng(0).choice(vocab, 8, replace=False).tolist()
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, repetition_penalty=1.1,
                          presence_penalty=0.3, frequency_penalty=0.3,
                          logit_bias={t: 1.5 for t in ids})


def decoding_engine(model, tok, prompts, params, kv_gib: float) -> LLMEngine:
    """An engine whose every row has finished its prefill (all rows decode from here)."""
    config = EngineConfig(kv_cache_memory_bytes=int(kv_gib * 2**30), max_num_seqs=len(prompts))
    eng = LLMEngine(config, model, tok)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    while any(r.num_output_tokens == 0 for r in [*eng.scheduler.running,
                                                *eng.scheduler.waiting]):
        eng.step()
    return eng


def timed_step(eng: LLMEngine) -> float:
    assert len(eng.scheduler.running) == eng.config.max_num_seqs, "a row left the batch"
    t0 = time.perf_counter()
    eng.step()
    return time.perf_counter() - t0


def isolated(eng: LLMEngine, reps: int) -> dict[str, float]:
    """The penalty work of one step alone (seconds, min over ``reps``), at the step's shapes:
    host entries (a fresh build, and the incremental one a step really does), then gather +
    scatter + argmax against argmax alone, on the real logits width."""
    reqs = list(eng.scheduler.running)
    width = eng.runner.geometry.logits_width
    fresh, incremental, device, argmax = [], [], [], []
    for _ in range(reps):
        state = PenaltyState()
        t0 = time.perf_counter()
        state.step(reqs)
        fresh.append(time.perf_counter() - t0)
        for r in reqs:  # one new token each, as between two decode steps
            r.output_token_ids.append(r.output_token_ids[-1])
        t0 = time.perf_counter()
        entries = state.step(reqs)
        mx.eval(entries)
        incremental.append(time.perf_counter() - t0)
        for r in reqs:
            r.output_token_ids.pop()
        for timing in (device, argmax):
            logits = mx.random.normal((len(reqs), width))
            mx.eval(logits)
            t0 = time.perf_counter()
            if timing is device:
                values = gather_entries(logits, entries)
                mx.eval(values)
                logits = apply_penalties(logits, values, entries)
                del values
            mx.eval(mx.argmax(logits, axis=-1))
            timing.append(time.perf_counter() - t0)
            del logits
    return {"host_fresh_s": min(fresh), "host_step_s": min(incremental),
            "device_s": min(device) - min(argmax), "entries": int(entries.rows.size)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="Model (default: Gemma 3 270M).")
    p.add_argument("--tiny", action="store_true", help="A tiny random llama (a quick check).")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--kv-memory", type=float, default=1.5, help="GiB per engine.")
    p.add_argument("--json", help="Write the results here.")
    a = p.parse_args()
    if a.tiny:
        from tests.tiny_models import byte_tokenizer, tiny_llama

        model, tok = tiny_llama(vocab=4096), byte_tokenizer()
    else:
        model, tok, _ = load_model(EngineConfig(model=a.model))
    prompts = random_workload(tok, a.rows, a.prompt_len, 1, 0.0).prompts
    # room for the decode steps taken while later rows still prefill (chunked prefill)
    max_tokens = a.rounds + 64
    vocab = int(model.args.vocab_size)
    plain = decoding_engine(model, tok, prompts,
                            SamplingParams(max_tokens=max_tokens, ignore_eos=True), a.kv_memory)
    pen = decoding_engine(model, tok, prompts, penalised_params(max_tokens, vocab), a.kv_memory)
    times: dict[str, list[float]] = {"plain": [], "penalised": []}
    for r in range(a.rounds):
        order = [("plain", plain), ("penalised", pen)]
        for name, eng in order if r % 2 else order[::-1]:
            times[name].append(timed_step(eng))
    med = {k: statistics.median(v[1:] or v) for k, v in times.items()}
    alone = isolated(pen, reps=3)
    res = {"rows": a.rows, "prompt_len": a.prompt_len, "rounds": a.rounds,
           "plain_step_s": med["plain"], "penalised_step_s": med["penalised"],
           "step_fraction": (med["penalised"] - med["plain"]) / med["plain"],
           "isolated_fraction": (alone["host_step_s"] + alone["device_s"]) / med["plain"],
           **alone}
    print(f"{a.rows} rows decoding, {a.prompt_len}-token prompts, medians of {a.rounds} "
          f"steps each: plain {1e3 * med['plain']:.1f} ms, every row penalised "
          f"{1e3 * med['penalised']:.1f} ms: {100 * res['step_fraction']:+.1f}% of the step")
    print(f"the penalty work alone ({alone['entries']} entries): host "
          f"{1e3 * alone['host_step_s']:.2f} ms per step ({1e3 * alone['host_fresh_s']:.1f} "
          f"ms to build from scratch), gather + scatter {1e3 * alone['device_s']:.2f} ms: "
          f"{100 * res['isolated_fraction']:.1f}% of the plain step")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
