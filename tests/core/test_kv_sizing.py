"""``kv_blocks_needed`` (the pool size a known input can use) and ``num_kv_blocks`` (the pool
size: the budget, at most the need), checked by hand."""

from __future__ import annotations

from mlxpa.core.kv_sizing import kv_blocks_needed, num_kv_blocks


def test_need_is_the_sum_of_blocks_per_sample_plus_the_null_block():
    # 20+8 tokens -> 2 blocks of 16; 16+0 -> 1; 33+0 -> 3, twice (n=2); 1 + 2 + 1 + 6 = 10
    assert kv_blocks_needed([(20, 8, 1), (16, 0, 1), (33, 0, 2)], 16, cap=1000) == 10


def test_context_caps_each_request():
    assert kv_blocks_needed([(30, 100, 1)], 16, cap=1000, max_model_len=64) == 1 + 4


def test_budget_caps_and_stops_reading():
    def rows():
        yield (160, 0, 1)  # 10 blocks: reaches the cap of 8
        raise AssertionError("read past the cap")

    assert kv_blocks_needed(rows(), 16, cap=8) == 8


def test_empty_input_still_gets_a_usable_pool():
    assert kv_blocks_needed([], 16, cap=100) == 2


def test_without_a_cap_the_whole_need_is_counted():
    assert kv_blocks_needed([(160, 0, 1), (16, 0, 3)], 16) == 1 + 10 + 3


def test_pool_is_the_budget_at_most_the_need():
    # 1,000 bytes at 96 per block: 10 blocks + the null block
    assert num_kv_blocks(1000, 96) == 11
    assert num_kv_blocks(1000, 96, need_blocks=5) == 5
    assert num_kv_blocks(1000, 96, need_blocks=50) == 11
    assert num_kv_blocks(10, 96) == 2 and num_kv_blocks(10**6, 96, need_blocks=1) == 2
