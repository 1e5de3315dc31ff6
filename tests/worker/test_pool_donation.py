"""Writes into the KV pools take over the pools' buffers instead of copying whole pools.

MLX lets a scatter reuse its input's buffer only when nothing else references it; a lazy read
of the same pool still pending (the gather of a copy-on-write, the attention of an earlier
forward group of the step) makes it copy the pool, each time, which costs about a second per
GiB on the CPU and grows with the pool. These tests time operations on large pools (40,000
blocks: 41 to 82 MB each) against a bound or the same step on a small pool: a copy of the
pools adds hundreds of milliseconds here (the bounds leave a wide margin for a loaded
machine)."""

from __future__ import annotations

import time

import mlx.core as mx

from mlxpa.config import EngineConfig
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.model_runner import ModelRunner, group_by_length
from tests.tiny_models import tiny_llama

BIG = 40_000  # blocks per pool


def _best_ms(fn, repeats: int = 4) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def test_copy_on_write_copies_blocks_not_pools():
    cache = PagedKVCache([(2, 32, 32)] * 2, BIG, 8, mx.float32)
    cache.key_caches[0][5] = mx.ones((2, 8, 32))
    mx.eval(cache.key_caches)

    def cow():
        cache.copy_blocks([(5, 7), (1, 2)])
        mx.eval(cache.key_caches, cache.value_caches)

    worst = max(_best_ms(cow, 1) for _ in range(6))  # the copy came and went by chance
    assert worst < 60, worst
    assert cache.key_caches[0][7].sum().item() == 2 * 8 * 32


def _three_group_step(num_blocks: int) -> float:
    """The best time of a step whose requests fall in three forward groups (chunks of 40,
    3 and 1 tokens) on a pool of ``num_blocks`` blocks."""
    runner = ModelRunner(tiny_llama(), EngineConfig(block_size=8, num_blocks=num_blocks))
    runner.allocate_kv_cache(runner.budget_blocks)
    assert runner.num_blocks == num_blocks
    counts = [40, 3, 1]
    assert len(group_by_length(counts)) == 3

    def step():
        reqs = []
        for k, n in enumerate(counts):
            req = Request(k, [3 + k] * 48, SamplingParams(max_tokens=1))
            req.num_computed_tokens = 0 if n == 40 else 48 - n
            req.block_tables = [list(range(1 + 6 * k, 1 + 6 * k + -(-(req.num_computed_tokens
                                                                    + n) // 8)))]
            reqs.append(req)
        sampling = [r.num_computed_tokens + n == 48 for r, n in zip(reqs, counts)]
        runner.execute(SchedulerOutput(reqs, counts, sum(counts), sampling))

    step()  # compiles and warms up
    return _best_ms(step)


def test_a_step_of_several_groups_copies_no_pool():
    small, big = _three_group_step(64), _three_group_step(BIG)
    assert big < 2 * small + 60, (small, big)
