"""The matmul limit: a float32 GEMM timed in this process, and ``mlxpa bench --workload limits``.

The limit of a workload is the time its matrix products would take at the GEMM rate this
process reaches on one large float32 product (``n x n @ n x n``, ``2 n^3`` FLOPs; the best of
a few runs after a warm-up), using the FLOPs per token of :mod:`mlxpa.bench.flops`. A system's
fraction of the limit is that time over its measured time.

``limits`` runs two workloads on mlxpa:

- prefill: 16 prompts x 512 random tokens, 1 output token each; prefill tok/s is prompt tokens
  over the run's time, against ``GEMM rate / FLOPs per prefill token``;
- decode: 128 rows x 8-token prompts, 48 output tokens each, minus the same rows with 1
  output token (the prompt part): 128 x 47 decoded tokens over the difference of the two
  times, against ``GEMM rate / FLOPs per decoded token`` (LM head included).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import mlx.core as mx

from mlxpa.bench.flops import ModelFlops
from mlxpa.bench.systems import run_system
from mlxpa.bench.workloads import random_workload
from mlxpa.config import EngineConfig


def gemm_flops_per_s(n: int = 2048, runs: int = 5) -> float:
    """FLOP/s of a float32 ``[n, n] @ [n, n]`` product: ``2 n^3`` over the best of ``runs``
    timed runs (after one warm-up)."""
    a = mx.random.normal((n, n), dtype=mx.float32)
    b = mx.random.normal((n, n), dtype=mx.float32)
    mx.eval(a, b, a @ b)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def limit_fraction(figures: dict, prompt_tokens: int, num_requests: int, flops: ModelFlops,
                   gemm_rate: float) -> float:
    """Fraction of the matmul limit of one system's figures (``elapsed_s``,
    ``generation_tokens``, ``cached_prompt_tokens`` when it has a prefix cache): the time its
    matrix products take at ``gemm_rate`` (FLOP/s) over its measured time."""
    cached = figures.get("cached_prompt_tokens") or 0
    work = flops.work(prompt_tokens - cached, figures["generation_tokens"], num_requests)
    return work / gemm_rate / figures["elapsed_s"]


@dataclass(frozen=True)
class LimitRow:
    """One phase of the limits workload: tokens, seconds, rate, the limit and the fraction."""

    phase: str
    tokens: int
    seconds: float
    limit_tokens_per_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def fraction(self) -> float:
        return self.tokens_per_s / self.limit_tokens_per_s


def _median_time(model, tokenizer, wl, config: EngineConfig, repeats: int) -> float:
    return statistics.median(run_system("mlxpa", model, tokenizer, wl, config).elapsed_s
                             for _ in range(repeats))


def run_limits(model, tokenizer, config: EngineConfig, flops: ModelFlops, gemm_rate: float,
               repeats: int = 1, prefill: tuple[int, int] = (16, 512),
               decode: tuple[int, int, int] = (128, 8, 48)) -> list[LimitRow]:
    """Time mlxpa's prefill and decode against the matmul limit (median of ``repeats``).

    Args:
        prefill: ``(prompts, prompt tokens)`` of the prefill workload (1 output token each).
        decode: ``(rows, prompt tokens, output tokens)`` of the decode workload.

    Returns:
        The prefill row and the decode row.
    """
    num, length = prefill
    rows, plen, out = decode
    if out < 2:
        raise ValueError("the decode workload needs at least 2 output tokens")
    wl_prefill = random_workload(tokenizer, num, length, 1, 0.0)
    wl_prompt = random_workload(tokenizer, rows, plen, 1, 0.0, seed=1)
    wl_decode = random_workload(tokenizer, rows, plen, out, 0.0, seed=1)
    small = random_workload(tokenizer, 2, 16, 2, 0.0, seed=2)
    run_system("mlxpa", model, tokenizer, small, config)  # warm-up
    t_prefill = _median_time(model, tokenizer, wl_prefill, config, repeats)
    t_prompt = _median_time(model, tokenizer, wl_prompt, config, repeats)
    t_decode = _median_time(model, tokenizer, wl_decode, config, repeats)
    return [LimitRow("prefill", wl_prefill.num_prompt_tokens, t_prefill,
                     gemm_rate / flops.prefill),
            LimitRow("decode", rows * (out - 1), max(t_decode - t_prompt, 1e-9),
                     gemm_rate / flops.decode)]
