"""What the draft-free proposers (``ngram``, ``suffix``) cost per call and per context token.

For each method and context length (1k, 8k, 32k tokens) one request's prompt is added, then
the request grows one token per step and asks for a draft after each: the script prints the
median microseconds of ``add_request`` (the whole prompt), ``propose`` (one new token, then
k drafts) and ``finish_request``, and the request's memory in bytes per context token
(tracemalloc: Python objects and numpy buffers). The suffix proposer's shared structure is
filled first with ``--cached`` finished outputs of ``--output-len`` tokens and holds at most
that many, so each finish also evicts one.

Token streams are synthetic, no tokenizer: ``text`` draws ids from a 32k vocabulary with
Zipf-Mandelbrot frequencies (rank r at 1 / (r + 2.7), natural text's fit: the commonest id is
~5% of tokens) and, at 2% of positions, copies a 5-40 token span from earlier in the stream
(the repeats prompt lookup and suffix decoding feed on); ``loop`` repeats three tokens (every
pattern matches everywhere: the suffix proposer's worst case, most of all when every cached
output is the same loop).

    python benchmarks/proposer_cost.py
    python benchmarks/proposer_cost.py --lengths 1024 8192 --steps 100 --streams text
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from mlxpa.spec_decode.ngram import NgramProposer
from mlxpa.spec_decode.suffix import SuffixDecodingProposer


def token_stream(kind: str, length: int, seed: int) -> list[int]:
    """``length`` synthetic token ids (see the module docstring)."""
    rng = np.random.default_rng(seed)
    if kind == "loop":
        return [(7, 8, 9)[i % 3] for i in range(length)]
    weights = 1.0 / (np.arange(32000) + 2.7)
    draws = rng.choice(32000, size=length, p=weights / weights.sum())
    out: list[int] = []
    while len(out) < length:
        if len(out) > 64 and rng.random() < 0.02:
            span = int(rng.integers(5, 41))
            start = int(rng.integers(0, len(out) - span))
            out.extend(out[start:start + span])
        else:
            out.append(int(draws[len(out)]))
    return out[:length]


def micros(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def measure(make, kind: str, length: int, steps: int, k: int, warm) -> dict[str, float]:
    """Per-call microseconds and bytes per context token of one request of ``length``."""
    stream = token_stream(kind, length + steps, seed=length)
    prompt = stream[:length]
    proposer = make()
    tracemalloc.start()
    proposer.add_request(0, prompt)
    memory = tracemalloc.get_traced_memory()[0] / length
    tracemalloc.stop()
    proposer = make()
    warm(proposer, kind)
    add_us = micros(lambda: proposer.add_request(0, prompt))
    times = []
    for n in range(length + 1, length + steps + 1):
        context = stream[:n]
        times.append(micros(lambda c=context: proposer.propose(0, c, k)))
    finish_us = micros(lambda: proposer.finish_request(0, stream[length:length + steps]))
    return {"add": add_us, "propose": statistics.median(times), "propose_max": max(times),
            "finish": finish_us, "bytes_per_token": memory}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--streams", nargs="+", default=["text", "loop"])
    ap.add_argument("--steps", type=int, default=200, help="propose calls per request")
    ap.add_argument("--k", type=int, default=4, help="draft tokens asked for")
    ap.add_argument("--cached", type=int, default=1000, help="outputs in the shared structure")
    ap.add_argument("--output-len", type=int, default=256)
    args = ap.parse_args()

    def no_warmup(proposer, kind):
        pass

    def fill_shared(proposer, kind):
        for i in range(args.cached):
            key = 1_000_000 + i
            proposer.add_request(key, [])
            proposer.finish_request(key, token_stream(kind, args.output_len, seed=i))

    methods = {
        "ngram": (lambda: NgramProposer(2, 4), no_warmup),
        "suffix": (lambda: SuffixDecodingProposer(24, args.cached, 1.0, 0.1), fill_shared),
    }
    print(f"k = {args.k}, {args.steps} propose calls per request; suffix: {args.cached} cached "
          f"outputs of {args.output_len} tokens, depth 24")
    print(f"{'method':7} {'stream':6} {'context':>7} {'add_request us':>15} "
          f"{'propose us (med / max)':>23} {'finish us':>10} {'bytes/token':>12}")
    for name, (make, warm) in methods.items():
        for kind in args.streams:
            for length in args.lengths:
                r = measure(make, kind, length, args.steps, args.k, warm)
                print(f"{name:7} {kind:6} {length:7d} {r['add']:15.0f} "
                      f"{r['propose']:11.1f} / {r['propose_max']:9.0f} {r['finish']:10.0f} "
                      f"{r['bytes_per_token']:12.1f}")


if __name__ == "__main__":
    main()
