"""``summarize`` on hand-built counters: every rate and ratio, and the percentiles (linear
interpolation between closest ranks, as numpy's default) computed by hand."""

from __future__ import annotations

import pytest

from mlxpa.engine.metrics import Counters, percentile, summarize


def test_summarize_hand_built_counters():
    c = Counters(start_time=10.0, requests=4, prompt_tokens=100, cached_prompt_tokens=25,
                 generation_tokens=50, num_preemptions=2, evicted_blocks=3, num_steps=9,
                 peak_kv_blocks=12, kv_tokens_held=30, kv_slots_in_use=40,
                 ttft_s=[4.0, 1.0, 3.0, 2.0], itl_s=[0.1, 0.3], failed_rows=1)
    s = summarize(c, now=20.0)
    assert s.elapsed_s == 10.0
    assert s.prefix_cache_hit_rate == 0.25
    assert s.total_tokens_per_s == 15.0 and s.output_tokens_per_s == 5.0
    assert s.requests_per_s == 0.4
    assert s.kv_utilization == 0.75
    assert (s.peak_kv_blocks, s.num_preemptions, s.evicted_blocks, s.failed_rows) == (12, 2, 3, 1)
    # Sorted TTFT 1, 2, 3, 4: p50 at rank 1.5 -> 2.5; p99 at rank 2.97 -> 3 + 0.97.
    assert s.ttft_p50_s == pytest.approx(2.5) and s.ttft_p99_s == pytest.approx(3.97)
    # ITL 0.1, 0.3: p50 -> 0.2; p99 at rank 0.99 -> 0.1 + 0.99 * 0.2.
    assert s.itl_p50_s == pytest.approx(0.2) and s.itl_p99_s == pytest.approx(0.298)
    assert s.to_dict()["ttft_p50_s"] == s.ttft_p50_s


def test_summarize_empty_counters():
    s = summarize(Counters(start_time=5.0), now=5.0)
    assert s.prefix_cache_hit_rate == 0.0 and s.kv_utilization == 0.0
    assert s.output_tokens_per_s == 0.0
    assert (s.ttft_p50_s, s.ttft_p99_s, s.itl_p50_s, s.itl_p99_s) == (None,) * 4


def test_percentile_interpolates():
    assert percentile([1.0, 2.0], 50) == 1.5  # nearest rank would say 1 or 2
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
