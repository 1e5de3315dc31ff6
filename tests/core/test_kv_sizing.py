"""``kv_blocks_needed`` (the pool size a known input can use) and ``num_kv_blocks`` (the pool
size: the budget, at most the need), checked by hand."""

from __future__ import annotations

from mlxpa.core.kv_cache_groups import KVCacheGroupSpec, KVCacheLayout, group_entries
from mlxpa.core.kv_sizing import kv_blocks_needed, num_kv_blocks

FULL = KVCacheLayout(16, (KVCacheGroupSpec(None, (0,)),), 1)  # one full-attention group


def test_need_is_the_sum_of_blocks_per_sample_plus_the_null_block():
    # 20+8 tokens -> 2 blocks of 16; 16+0 -> 1; 33+0 -> 3, twice (n=2); 1 + 2 + 1 + 6 = 10
    assert kv_blocks_needed([(20, 8, 1), (16, 0, 1), (33, 0, 2)], FULL, 2048, cap=1000) == 10


def test_context_caps_each_request():
    assert kv_blocks_needed([(30, 100, 1)], FULL, 2048, cap=1000, max_model_len=64) == 1 + 4


def test_budget_caps_and_stops_reading():
    def rows():
        yield (160, 0, 1)  # 10 blocks: reaches the cap of 8
        raise AssertionError("read past the cap")

    assert kv_blocks_needed(rows(), FULL, 2048, cap=8) == 8


def test_empty_input_still_gets_a_usable_pool():
    assert kv_blocks_needed([], FULL, 2048, cap=100) == 2


def test_without_a_cap_the_whole_need_is_counted():
    assert kv_blocks_needed([(160, 0, 1), (16, 0, 3)], FULL, 2048) == 1 + 10 + 3


def test_pool_is_the_budget_at_most_the_need():
    # 1,000 bytes at 96 per block: 10 blocks + the null block
    assert num_kv_blocks(1000, 96) == 11
    assert num_kv_blocks(1000, 96, need_blocks=5) == 5
    assert num_kv_blocks(1000, 96, need_blocks=50) == 11
    assert num_kv_blocks(10, 96) == 2 and num_kv_blocks(10**6, 96, need_blocks=1) == 2


def test_sliding_window_groups_count_only_their_window():
    """Gemma 3's shape: 1 full group and 5 window groups (window 512) of 3 layers. A
    8,192-token request holds 512 full blocks and, per window group, the window before a
    256-token chunk and the chunk: ceil((511 + 256) / 16) + 1 = 49 blocks, not 512."""
    kinds = [(None if (i + 1) % 6 == 0 else 512, "pool") for i in range(18)]
    layout = group_entries(kinds, 16)
    assert layout.windows == [None] + [512] * 5 and layout.num_slots == 3
    assert layout.max_chunk_tokens == 256
    assert kv_blocks_needed([(8192, 0, 1)], layout, 2048) == 1 + 512 + 5 * 49
    # a short request never holds more than its own blocks in any group
    assert kv_blocks_needed([(100, 0, 1)], layout, 2048) == 1 + 6 * 7
    # a step budget below the cap bounds the chunk: ceil((511 + 64) / 16) + 1 = 37
    assert kv_blocks_needed([(8192, 0, 1)], layout, 64) == 1 + 512 + 5 * 37


def test_recurrent_snapshots_are_counted():
    """A hybrid (one full group) whose snapshot takes 3 blocks: one per request, one more for
    a request whose samples fork."""
    layout = KVCacheLayout(16, (KVCacheGroupSpec(None, (0,)),), 1, recurrent=(1,),
                           snapshot_blocks=3)
    assert kv_blocks_needed([(32, 0, 1)], layout, 2048) == 1 + 2 + 3
    assert kv_blocks_needed([(32, 0, 2)], layout, 2048) == 1 + 2 * 2 + 6
