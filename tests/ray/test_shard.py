"""Shard planning and the driver's sum of replica counters (pure Python; no Ray, no mlx)."""

from __future__ import annotations

import pytest

from mlxpa.engine.metrics import Counters
from mlxpa.ray.shard import plan_shards, shared_blocks
from mlxpa.ray.stats import ClusterCounters, delta, snapshot

BS = 4


def group_rows(prefixes: list[list[int]], per_group: int) -> tuple[list[list[int]], list[int]]:
    """Rows of ``per_group`` prompts per prefix, interleaved (row i is in group i % groups),
    each ending with its own 2 tokens; and the group of each row."""
    rows, groups = [], []
    for i in range(per_group * len(prefixes)):
        g = i % len(prefixes)
        rows.append(prefixes[g] + [100 + i, 200 + i])
        groups.append(g)
    return rows, groups


def test_shared_blocks_counts_whole_equal_blocks():
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert shared_blocks(a, a, BS) == 2  # the partial third block never counts
    assert shared_blocks(a, [1, 2, 3, 4, 5, 6, 7, 0], BS) == 1
    assert shared_blocks(a, [0, 2, 3, 4], BS) == 0


def test_prefix_shards_hold_whole_groups():
    prefixes = [[g] * 8 for g in (1, 2, 3)]  # two blocks each, different from the first
    rows, groups = group_rows(prefixes, 4)
    shards = plan_shards(rows, BS, 4, "prefix")
    assert sorted(i for s in shards for i in s) == list(range(12))
    assert sorted(sorted(s) for s in shards) == sorted(
        [i for i in range(12) if groups[i] == g] for g in range(3))


def test_prefix_cut_lands_where_a_large_group_branches_highest():
    # One 8-row group sharing 1 block; rows 0-3 then share a 2nd and 3rd block, rows 4-7 others.
    rows = [[9] * 4 + [1] * 8 + [i] for i in range(4)] + [[9] * 4 + [2] * 8 + [i] for i in range(4)]
    shards = plan_shards(rows, BS, 3, "prefix")  # a cut in [1, 4] of 8 rows; the branch is at 4
    assert shards[0] == [0, 1, 2, 3]
    assert sorted(i for s in shards for i in s) == list(range(8))


def test_random_and_input_shards_are_equal_cuts_that_split_groups():
    rows, groups = group_rows([[g] * 8 for g in (1, 2, 3)], 4)
    assert plan_shards(rows, BS, 4, "input") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    shards = plan_shards(rows, BS, 4, "random", seed=3)
    assert sorted(i for s in shards for i in s) == list(range(12))
    assert [len(s) for s in shards] == [4, 4, 4]
    assert any(len({groups[i] for i in s}) > 1 for s in shards)
    assert shards == plan_shards(rows, BS, 4, "random", seed=3)  # seeded


def test_bad_arguments():
    with pytest.raises(ValueError, match="sharding must be one of"):
        plan_shards([[1]], BS, 1, "hash")
    with pytest.raises(ValueError, match="shard_rows must be >= 1"):
        plan_shards([[1]], BS, 0)


def test_cluster_counters_sum_replicas_and_keep_each_peak():
    a, b = Counters(), Counters()
    before_a, before_b = snapshot(a), snapshot(b)
    a.requests, a.prompt_tokens, a.cached_prompt_tokens, a.generation_tokens = 3, 30, 12, 9
    a.peak_kv_blocks, a.ttft_s, a.itl_s = 7, [0.1, 0.2, 0.3], [0.01] * 6
    b.requests, b.prompt_tokens, b.cached_prompt_tokens, b.generation_tokens = 2, 20, 0, 4
    b.peak_kv_blocks, b.ttft_s, b.itl_s, b.failed_rows = 5, [0.4], [0.02] * 2, 1
    cluster = ClusterCounters()
    cluster.add(delta(a, before_a, "A", "h:1", 1.5))
    cluster.add(delta(b, before_b, "B", "h:2", 2.5))
    second = snapshot(a)
    a.requests, a.prompt_tokens, a.peak_kv_blocks, a.ttft_s = 4, 40, 6, a.ttft_s + [0.5]
    cluster.add(delta(a, second, "A", "h:1", 1.5))
    c = cluster.counters
    assert (c.requests, c.prompt_tokens, c.cached_prompt_tokens) == (6, 60, 12)
    assert (c.generation_tokens, c.failed_rows) == (13, 1)
    assert c.ttft_s == [0.1, 0.2, 0.3, 0.4, 0.5] and len(c.itl_s) == 8
    assert cluster.peak_kv_blocks == {"A": 7, "B": 5} and c.peak_kv_blocks == 7
    assert cluster.load_s == {"h:1": 1.5, "h:2": 2.5}


def test_prefix_shards_pack_groups_up_to_the_target_and_never_cut_a_fitting_group():
    sizes = [2, 2, 3, 6]  # groups A, B, C, D, each with its own 2-block prefix
    rows, groups = [], []
    for g, n in enumerate(sizes):
        rows += [[g + 1] * 8 + [50 + i] for i in range(n)]
        groups += [g] * n
    shards = plan_shards(rows, BS, 4, "prefix")
    # A+B fill 4; C would overfill them; D (6 <= 2 * 4) stays whole on its own
    assert [sorted({groups[i] for i in s}) for s in shards] == [[0, 1], [2], [3]]
    # a group of twice the target stays whole (2 replicas, 2 groups of 4 rows: 2 rows a shard)
    two, _ = group_rows([[1] * 8, [2] * 8], 4)
    assert sorted(sorted(s) for s in plan_shards(two, BS, 2, "prefix")) == [
        [0, 2, 4, 6], [1, 3, 5, 7]]


def test_ray_shards_do_not_join_rows_of_two_salts():
    rows = [[1] * 8 + [i] for i in range(6)]
    assert plan_shards(rows, BS, 3, "prefix") == [list(range(6))]  # one group: kept whole
    shards = plan_shards(rows, BS, 3, "prefix", salts=["a", "b"] * 3)
    assert shards == [[0, 2, 4], [1, 3, 5]]
