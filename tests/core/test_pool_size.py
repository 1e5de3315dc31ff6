"""A KV pool that follows the load: segments of block ids (lowest first), growth before
eviction, release by compaction (:mod:`mlxpa.core.pool_size`).

Oracles: exact block ids and free orders on pools of a few blocks; a pool that grows to a
ceiling takes exactly the scheduling decisions of a fixed pool of that ceiling (the same
requests, chunks, preemptions and prefix hits in every step: only the block ids differ),
checked on random workloads; a compaction moves each kept block's contents (the pairs) and
renames it in the tree, so the same prefixes hit after it with every id below the new size;
``check_invariants()`` after every operation.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool, NoFreeBlocksError
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.pool_size import compact, grow_for
from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request, RequestStatus
from mlxpa.sampling_params import SamplingParams

BS = 4


def request(request_id: object, tokens: list[int], max_tokens: int = 4) -> Request:
    return Request(request_id, list(tokens), SamplingParams(max_tokens=max_tokens,
                                                            ignore_eos=True))


# ----------------------------------------------------------------------------- BlockPool


def test_a_segmented_pool_starts_small_and_hands_out_the_lowest_ids_first():
    pool = BlockPool(12, BS, segment_blocks=4, initial_blocks=4)
    assert (pool.num_blocks, pool.max_num_blocks, pool.num_segments) == (4, 12, 1)
    assert pool.free_queue() == [1, 2, 3] and pool.num_usable_blocks == 3
    assert pool.max_usable_blocks == 11
    assert pool.grow(5) == 4  # whole segments: 8 blocks
    assert pool.free_queue() == [1, 2, 3, 4, 5, 6, 7] and pool.num_segments == 2
    a = pool.allocate(5)
    assert a == [1, 2, 3, 4, 5]
    pool.free([5, 2])  # each block back to its own segment's queue
    assert pool.free_queue() == [2, 6, 7, 5]
    assert pool.allocate(2) == [2, 6]  # the lowest segment first
    pool.check_invariants([[1, 3, 4], [2, 6]])


def test_the_last_segment_is_cut_at_the_ceiling():
    pool = BlockPool(10, BS, segment_blocks=4, initial_blocks=1)
    assert pool.num_blocks == 4
    assert pool.grow(100) == 6 and pool.num_blocks == 10 and pool.num_segments == 3
    assert pool.free_queue()[-2:] == [8, 9] and pool.grow(11) == 0
    assert pool.size_for(9) == 10 and pool.size_for(5) == 8 and pool.size_for(0) == 4
    pool.check_invariants([])
    with pytest.raises(ValueError, match="segment_blocks"):
        BlockPool(10, BS, segment_blocks=1)


def test_a_fixed_pool_is_one_segment():
    pool = BlockPool(11, BS)
    assert (pool.num_blocks, pool.segment_blocks, pool.num_segments) == (11, 11, 1)
    assert pool.grow(20) == 0 and pool.shrink(2) == 0


def test_shrink_refuses_a_held_block_until_relocate_moves_it_down():
    pool = BlockPool(12, BS, segment_blocks=4, initial_blocks=12)
    held = pool.allocate(5)  # 1..5: 4 and 5 in segment 1
    pool.incref([5])
    pool.free([2, 1])
    with pytest.raises(RuntimeError, match="in use"):
        pool.shrink(4)
    moves = pool.relocate(4)
    assert moves == {4: 2, 5: 1}  # segment 0's free queue: 2, then 1
    assert [pool.ref_cnt(b) for b in (1, 2, 3)] == [2, 1, 1]
    assert pool.shrink(4) == 8 and pool.num_blocks == 4 and pool.num_free_blocks == 0
    pool.check_invariants([[3], [2], [1, 1]])
    del held


def test_relocate_refuses_when_the_held_blocks_do_not_fit_below():
    pool = BlockPool(8, BS, segment_blocks=4, initial_blocks=8)
    pool.allocate(5)
    with pytest.raises(NoFreeBlocksError):
        pool.relocate(4)
    pool.check_invariants([[1, 2, 3, 4, 5]])


def test_grow_for_grows_by_half_of_the_pool_at_least():
    pool = BlockPool(100, BS, segment_blocks=4, initial_blocks=4)
    assert grow_for(pool, 0) == 0
    assert grow_for(pool, 1) == 4  # 4 + max(1, 2) -> 8
    assert grow_for(pool, 1) == 4  # 8 + max(1, 4) -> 12
    assert grow_for(pool, 9) == 12  # 12 + max(9, 6) -> 21 -> 24
    assert grow_for(pool, 1000) == 76 and grow_for(pool, 1) == 0  # the ceiling


# ----------------------------------------------------------------------------- the manager


def test_the_pool_grows_before_evicting_cached_blocks_and_evicts_at_its_ceiling():
    kv = KVCacheManager(BlockPool(13, BS, segment_blocks=4, initial_blocks=4))
    a = request("a", range(12))  # 3 blocks
    assert kv.allocate_slots(a, 12) == [[1, 2, 3]]
    a.num_computed_tokens = 12
    kv.cache_blocks(a)
    kv.free(a)
    assert kv.tree.total_blocks == 3 and kv.pool.num_free_blocks == 0
    b = request("b", range(50, 58))
    assert kv.allocate_slots(b, 8) == [[4, 5]]  # grown (to 8), nothing evicted
    assert kv.pool.num_blocks == 8 and kv.evicted_blocks == 0
    c = request("c", range(70, 90))
    assert kv.allocate_slots(c, 20) == [[6, 7, 8, 9, 10]]  # grown to 13, the ceiling
    d = request("d", range(90, 98))
    assert kv.allocate_slots(d, 8) == [[11, 12]]
    e = request("e", range(110, 114))
    assert kv.allocate_slots(e, 4) is not None and kv.evicted_blocks >= 1  # now it evicts
    kv.check_invariants([b, c, d, e])
    assert kv.num_available_blocks == kv.pool.num_free_blocks + kv.tree.evictable_blocks


def test_capacity_and_available_blocks_count_the_ceiling():
    kv = KVCacheManager(BlockPool(13, BS, segment_blocks=4, initial_blocks=4),
                        enable_prefix_caching=False)
    assert kv.capacity_tokens == 12 * BS and kv.num_available_blocks == 12


def cached_pool() -> tuple[KVCacheManager, list[Request]]:
    """A pool of 3 segments of 4 whose tree caches three 2-block prompts, used in order."""
    kv = KVCacheManager(BlockPool(12, BS, segment_blocks=4, initial_blocks=4))
    reqs = [request(name, range(100 * i, 100 * i + 9)) for i, name in enumerate("abc")]
    for r in reqs:  # each holds 3 blocks; its 2 full ones stay in the tree
        kv.allocate_slots(r, 9)
        r.num_computed_tokens = 9
        kv.cache_blocks(r)
    for r in reqs:
        kv.free(r)
    kv.check_invariants([])
    return kv, reqs


def test_compact_keeps_the_most_recently_used_prefixes_moved_below_the_new_size():
    kv, reqs = cached_pool()
    assert kv.pool.num_blocks == 12 and kv.tree.total_blocks == 6
    before = {r.request_id: kv.get_computed_blocks(r).block_ids[0] for r in reqs}
    assert before == {"a": [1, 2], "b": [4, 5], "c": [7, 8]}
    kv.get_computed_blocks(reqs[0])  # "a" is used again: "b" is now the oldest
    pairs = kv.shrink_pool(6)  # 2 segments: 7 usable blocks hold the 3 prompts of 2
    assert kv.pool.num_blocks == 8
    kv.check_invariants([])
    after = {r.request_id: kv.get_computed_blocks(r) for r in reqs}
    assert after["a"].block_ids[0] == [1, 2]
    assert after["c"].num_tokens == 8 and all(b < 8 for b in after["c"].block_ids[0])
    assert pairs == [(8, 3)] and after["c"].block_ids[0] == [7, 3]  # 3: the lowest free
    assert after["b"].block_ids[0] == [4, 5]  # kept where it was (below 8)
    assert kv.evicted_blocks == 0


def test_compact_evicts_the_least_recently_used_until_the_rest_fit():
    kv, reqs = cached_pool()
    kv.get_computed_blocks(reqs[0])  # "a" used last: "b", then "c", are the oldest
    pairs = kv.shrink_pool(1)  # one segment: 3 usable blocks, 2 prompts of 2 do not fit
    assert kv.pool.num_blocks == 4 and kv.evicted_blocks >= 3
    kv.check_invariants([])
    hits = {r.request_id: kv.get_computed_blocks(r).num_tokens for r in reqs}
    assert hits["a"] == 8 and hits["b"] == 0
    assert all(src >= 4 > dst for src, dst in pairs)


def test_compact_refuses_while_a_request_holds_blocks():
    kv, reqs = cached_pool()
    d = request("d", range(500, 505))
    kv.allocate_slots(d, 5)
    with pytest.raises(RuntimeError, match="no request holds a block"):
        compact(kv.pool, kv.tree, 4)
    kv.check_invariants([d])


# ----------------------------------------------------------------------------- the scheduler


def scheduler(num_blocks: int, segment_blocks: int | None, prefix_caching: bool = True,
              release_after: float = 30.0) -> Scheduler:
    config = EngineConfig(num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=16,
                          kv_release_after=release_after)
    pool = BlockPool(num_blocks, BS, segment_blocks, segment_blocks)
    return Scheduler(config, KVCacheManager(pool, prefix_caching), max_model_len=1000)


def drive(sched: Scheduler, reqs: list[Request]) -> list[tuple]:
    """Run ``reqs`` to completion (token 7 each step); each step's decisions (request ids,
    token counts, samples, preemptions, prefix hits), the pool's invariants after each."""
    for r in reqs:
        sched.add_request(r)
    steps, kv = [], sched.kv_cache_manager
    while sched.has_unfinished_requests():
        assert len(steps) < 500
        out = sched.schedule()
        assert out.num_kv_blocks == kv.pool.num_blocks
        assert all(b < out.num_kv_blocks for r in out.requests for t in r.block_tables
                   for b in t)
        steps.append((tuple((r.request_id, n, r.num_cached_tokens) for r, n in zip(
            out.requests, out.num_scheduled_tokens)), tuple(r.request_id for r in out.preempted)))
        sched.update_from_output(out, [[7] for s in out.sampling if s])
        kv.check_invariants(sched.running + list(sched.waiting))
    return steps


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 14), st.integers(1, 6)),
                min_size=1, max_size=10),
       st.integers(12, 40), st.integers(2, 8), st.booleans())
def test_a_growing_pool_decides_as_a_fixed_pool_of_its_ceiling(rows, ceiling, segment, cache):
    """Requests over 3 shared prefixes: growth happens exactly where the fixed pool has the
    blocks free, eviction only at the ceiling, so every step is the same."""
    def reqs():
        return [request(i, [1000 * p + t for t in range(8)] + [i * 100 + t for t in range(n)],
                        m) for i, (p, n, m) in enumerate(rows)]

    fixed, growing = scheduler(ceiling, None, cache), scheduler(ceiling, segment, cache)
    assert drive(growing, reqs()) == drive(fixed, reqs())
    kv = growing.kv_cache_manager
    assert kv.evicted_blocks == fixed.kv_cache_manager.evicted_blocks
    assert kv.pool.num_blocks <= ceiling and kv.num_active_blocks == 0
    held = kv.tree.total_blocks if cache else 0
    pairs = kv.shrink_pool(segment)  # the idle release: back to one segment
    assert kv.pool.num_blocks == kv.pool.size_for(segment)
    assert all(src >= kv.pool.num_blocks > dst for src, dst in pairs)
    if cache:  # what fits is kept (one group: eviction drops exactly what it is asked)
        assert kv.tree.total_blocks == min(held, kv.pool.num_usable_blocks)
    kv.check_invariants([])
    assert drive(growing, reqs())  # runs again from one segment


def test_release_is_due_kv_release_after_the_last_step_and_only_when_idle():
    sched = scheduler(24, 4, release_after=30.0)
    kv = sched.kv_cache_manager
    assert sched.kv_release_due(0.0) is None  # one segment: nothing to give back
    reqs = [request(i, range(20 * i, 20 * i + 10), 6) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert kv.pool.num_blocks > 4 and sched.kv_release_due(0.0) is None  # in flight
    with pytest.raises(RuntimeError, match="no request is in flight"):
        sched.release_kv_memory()
    sched.update_from_output(out, [[7] for s in out.sampling if s])
    sched.finish_request(reqs[0], RequestStatus.FINISHED_ABORTED)
    drive(sched, [])
    last = sched._last_step
    assert sched.kv_release_due(last + 10) == pytest.approx(20.0)
    assert sched.kv_release_due(last + 31) == 0.0
    out = sched.release_kv_memory()
    assert out.num_kv_blocks == 4 and not out.requests and out.total_num_scheduled_tokens == 0
    assert all(src >= 4 > dst for src, dst in out.blocks_to_copy) and out.blocks_to_copy
    assert sched.kv_release_due(last + 100) is None
    kv.check_invariants([])
    never = scheduler(24, 4, release_after=-1)
    drive(never, [request(0, range(30), 4)])
    assert never.kv_cache_manager.pool.num_blocks > 4 and never.kv_release_due(1e9) is None
