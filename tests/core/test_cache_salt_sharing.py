"""``cache_salt`` past the radix tree: the scheduler's in-batch prefix deduplication, prefix
hits, cascade groups and recurrent snapshot points share only within a salt; the offline
prefix order treats each salt as its own tree."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.common_prefix import CascadeGroup
from mlxpa.core.kv_cache_groups import group_entries
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.prefix_order import SharedPrefix, prefix_order, shared_prefix_stats
from mlxpa.core.scheduler import Scheduler
from mlxpa.core.shared_prefix import snapshot_points
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams

BS = 4
DOC = list(range(100, 110))  # 10 tokens: 2 full blocks + 2


def _run(sched: Scheduler) -> list:
    """Every step's output and the block tables its requests held in it."""
    outs = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        tables = [[list(t) for t in r.block_tables] for r in out.requests]
        sched.update_from_output(out, [[7]] * sum(out.sampling))
        outs.append((out, tables))
        assert len(outs) < 50
    return outs


def test_only_requests_of_one_salt_wait_for_hit_and_group_with_each_other():
    """Four requests over one document: 0 and 1 salted "a", 2 salted "b", 3 unsalted. Only 1
    waits for 0's prefill of the document and hits it; 2 and 3 compute it themselves, in
    blocks of their own; the one cascade group is 0 and 1."""
    config = EngineConfig(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=256)
    kv = KVCacheManager(BlockPool(64, BS))
    sched = Scheduler(config, kv, max_model_len=1000)
    reqs = [Request(i, DOC + [200 + i, 300 + i], SamplingParams(max_tokens=4, ignore_eos=True),
                    cache_salt=salt) for i, salt in enumerate(("a", "a", "b", None))]
    for r in reqs:
        sched.add_request(r)
    (first, _), (second, _), (third, tables), *_ = _run(sched)
    assert [r.request_id for r in first.requests] == [0, 2, 3]  # 1 waits for 0's blocks
    assert first.num_scheduled_tokens == [12, 12, 12]
    assert [r.request_id for r in second.requests] == [0, 2, 3, 1]
    assert second.num_scheduled_tokens == [1, 1, 1, 4]  # 1 computes its own 4 tokens
    assert [r.num_cached_tokens for r in reqs] == [0, 8, 0, 0]
    assert third.cascade_groups == [CascadeGroup((0, 3), 2)]  # requests 0 and 1
    assert tables[0][0][:2] == tables[3][0][:2]  # 0 and 1 share the document's blocks
    assert set(tables[1][0]).isdisjoint(tables[0][0])  # 2 ("b") shares no block
    assert set(tables[2][0]).isdisjoint(tables[0][0] + tables[1][0])  # nor 3 (unsalted)
    # afterwards: the document is cached once per namespace that computed it
    tree = kv.tree
    assert {r.cache_salt for r in tree.roots()} == {None, "a", "b"}
    for r in reqs:  # 12 prompt tokens: 3 full blocks each, in its own namespace
        assert tree.num_cached_blocks(r.prompt_token_ids, r.cache_salt) == 3
    assert tree.num_cached_blocks(reqs[0].prompt_token_ids, "b") == 2  # "b"'s document
    assert tree.num_cached_blocks(reqs[0].prompt_token_ids, "c") == 0
    kv.check_invariants([])


def test_a_fork_keeps_its_parents_salt():
    kv = KVCacheManager(BlockPool(16, BS))
    parent = Request("p", DOC, SamplingParams(max_tokens=2), cache_salt="a")
    assert kv.allocate_slots(parent, 10) is not None
    parent.num_computed_tokens = 10
    with pytest.raises(AssertionError, match="cache salts"):
        kv.fork(parent, Request("p", DOC, SamplingParams(max_tokens=2), sample_index=1))


def test_recurrent_snapshot_points_look_only_at_the_same_salt():
    layout = group_entries([(None, "kv"), None], BS, recurrent=(1,), snapshot_blocks=1)
    kv = KVCacheManager(BlockPool(32, BS), layout=layout)
    req = Request(0, DOC + [1, 2, 3], SamplingParams(max_tokens=2), cache_salt="a")
    other = {s: Request(1, DOC + [7, 8, 9], SamplingParams(max_tokens=2), cache_salt=s)
             for s in ("a", "b", None)}
    assert snapshot_points(req, 0, [other["a"]], [], kv) == [8]  # shares 2 blocks
    assert snapshot_points(req, 0, [other["b"], other[None]], [], kv) == []
    assert snapshot_points(req, 0, [], [other["b"]], kv) == []
    table = kv.pool.allocate(3)  # another "b" request cached 3 blocks of the same tokens
    kv.tree.insert(DOC + [1, 2], [table], cache_salt="b")
    assert kv.cached_prefix_blocks(DOC + [1, 2, 3], "b") == 3
    assert snapshot_points(req, 0, [], [], kv) == []
    bob = Request(2, DOC + [1, 2, 3], SamplingParams(max_tokens=2), cache_salt="b")
    assert snapshot_points(bob, 0, [], [], kv) == [12]  # where "b"'s cached blocks end


def test_prefix_order_and_stats_keep_salts_apart():
    rows = [[1] * 8 + [2], [5] * 8, [1] * 8 + [3], [1] * 8 + [4]]
    salts = ["x", None, "y", "x"]
    # unsalted, rows 0, 2, 3 share two blocks; salted, only 0 and 3 do
    assert prefix_order(rows, BS) == [0, 2, 3, 1]
    assert prefix_order(rows, BS, salts) == [0, 3, 1, 2]  # "x", then None, then "y"
    assert prefix_order(rows, BS, [None] * 4) == prefix_order(rows, BS)
    assert shared_prefix_stats(rows, BS).top_prefixes == [SharedPrefix(8, 3, 0)]
    stats = shared_prefix_stats(rows, BS, salts=salts)
    assert stats.top_prefixes == [SharedPrefix(8, 2, 0)]
    assert stats.num_unique_tokens == 6 * 4 + 3  # x: 2 blocks, None: 2, y: 2 (+ tails)
    assert shared_prefix_stats(rows, BS).num_unique_tokens == 4 * 4 + 3
    with pytest.raises(ValueError, match="3 salts for 4 prompts"):
        prefix_order(rows, BS, salts[:3])
