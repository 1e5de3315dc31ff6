"""Tests for mlxpa.core.kv_cache_manager: exact block ids for prefill, chunked prefill and decode,
free order, fork and copy-on-write of a partial block, a computed prefix forked into a table.

Setup: the tiny pool of :mod:`tests.core.pool_helpers`; ``check_invariants()`` after every step.
"""

from __future__ import annotations

from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.radix_cache import PrefixMatch
from tests.core.pool_helpers import BS, USABLE, make_pool, make_request, ref_cnts, snapshot


def test_manager_capacity_and_usage():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    assert kv.block_size == BS
    assert kv.capacity_tokens == USABLE * BS == 40
    assert kv.num_used_blocks == 0 and kv.pool.usage == 0.0
    assert kv.get_computed_blocks(make_request("a", 9)) == PrefixMatch([[]], 0)


def test_allocate_slots_exact_ids_prefill_then_decode():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a = make_request("a", 10)
    assert kv.allocate_slots(a, 10) == [[1, 2, 3]]
    assert a.block_tables[0] == [1, 2, 3]
    assert kv.num_used_blocks == 3
    kv.check_invariants([a])
    a.num_computed_tokens = 10
    assert kv.allocate_slots(a, 2) == [[]]  # tokens 10, 11 fit in block 3
    assert a.block_tables[0] == [1, 2, 3]
    kv.check_invariants([a])
    a.num_computed_tokens = 12
    assert kv.allocate_slots(a, 1) == [[4]]
    assert a.block_tables[0] == [1, 2, 3, 4]
    kv.check_invariants([a])
    assert kv.take_blocks_to_copy() == []


def test_allocate_slots_chunked_prefill():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a = make_request("a", 10)
    got = []
    for n in (4, 4, 2):
        got.append(kv.allocate_slots(a, n))
        a.num_computed_tokens += n
        kv.check_invariants([a])
    assert got == [[[1]], [[2]], [[3]]]
    assert a.block_tables[0] == [1, 2, 3]


def test_allocate_slots_interleaved_requests():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a, b = make_request("a", 5), make_request("b", 3)
    assert kv.allocate_slots(a, 5) == [[1, 2]]
    assert kv.allocate_slots(b, 3) == [[3]]
    a.num_computed_tokens, b.num_computed_tokens = 5, 3
    assert kv.allocate_slots(b, 2) == [[4]]
    assert kv.allocate_slots(a, 4) == [[5]]
    assert (a.block_tables[0], b.block_tables[0]) == ([1, 2, 5], [3, 4])
    kv.check_invariants([a, b])


def test_allocate_slots_returns_none_when_full_and_changes_nothing():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a, b = make_request("a", 36), make_request("b", 8)
    assert kv.allocate_slots(a, 36) == [list(range(1, 10))]
    before = snapshot(kv.pool)
    assert kv.allocate_slots(b, 8) is None
    assert b.block_tables == []
    assert snapshot(kv.pool) == before
    kv.check_invariants([a, b])
    assert kv.allocate_slots(b, 4) == [[10]]
    kv.check_invariants([a, b])


def test_manager_free_releases_tail_first():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a, b = make_request("a", 12), make_request("b", 8)
    assert kv.allocate_slots(a, 12) == [[1, 2, 3]]
    assert kv.allocate_slots(b, 8) == [[4, 5]]
    kv.free(a)
    assert a.block_tables == []
    kv.check_invariants([a, b])
    assert kv.pool.free_queue() == [6, 7, 8, 9, 10, 3, 2, 1]
    c = make_request("c", 32)
    assert kv.allocate_slots(c, 32) == [[6, 7, 8, 9, 10, 3, 2, 1]]
    kv.check_invariants([a, b, c])
    kv.free(b)
    kv.free(c)
    kv.check_invariants([a, b, c])
    assert kv.num_used_blocks == 0


def test_manager_free_of_full_pool_reuses_last_block_first():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a = make_request("a", 40)
    assert kv.allocate_slots(a, 40) == [list(range(1, 11))]
    kv.free(a)
    kv.check_invariants([a])
    b = make_request("b", 4)
    assert kv.allocate_slots(b, 4) == [[10]]
    kv.free(b)  # 10 goes to the tail again
    c = make_request("c", 8)
    assert kv.allocate_slots(c, 8) == [[9, 8]]


def test_manager_free_twice_is_harmless():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    a = make_request("a", 5)
    kv.allocate_slots(a, 5)
    kv.free(a)
    kv.free(a)  # block_table is [] after the first free
    kv.check_invariants([a])
    assert kv.num_used_blocks == 0


def test_manager_fork_then_copy_on_write_of_partial_block():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    parent, child = make_request("p", 6), make_request("c", 6)
    assert kv.allocate_slots(parent, 6) == [[1, 2]]
    parent.num_computed_tokens = 6
    parent.output_token_ids.append(7)
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens  # the scheduler sets it
    child.output_token_ids.append(8)
    assert child.block_tables[0] == [1, 2] and child.num_computed_tokens == 6
    assert ref_cnts(kv.pool)[:4] == [0, 2, 2, 0]
    kv.check_invariants([parent, child])
    # The parent appends into shared block 2 (token 6): it gets a private copy, block 3.
    assert kv.allocate_slots(parent, 1) == [[]]
    assert parent.block_tables[0] == [1, 3]
    assert kv.take_blocks_to_copy() == [(2, 3)]
    assert kv.take_blocks_to_copy() == []
    kv.check_invariants([parent, child])
    # Block 2 is now the child's alone: no copy.
    assert kv.allocate_slots(child, 1) == [[]]
    assert child.block_tables[0] == [1, 2]
    assert kv.take_blocks_to_copy() == []
    assert ref_cnts(kv.pool)[:5] == [0, 2, 1, 1, 0]
    kv.check_invariants([parent, child])
    kv.free(parent)
    kv.free(child)
    kv.check_invariants([parent, child])
    assert kv.pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]


def test_manager_fork_at_block_boundary_needs_no_copy():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    parent, child = make_request("p", 8), make_request("c", 8)
    assert kv.allocate_slots(parent, 8) == [[1, 2]]
    parent.num_computed_tokens = 8
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens  # the scheduler sets it
    assert kv.allocate_slots(parent, 1) == [[3]]
    assert kv.allocate_slots(child, 1) == [[4]]
    assert kv.take_blocks_to_copy() == []
    assert (parent.block_tables[0], child.block_tables[0]) == ([1, 2, 3], [1, 2, 4])
    kv.check_invariants([parent, child])


def test_manager_copy_on_write_and_new_block_in_one_call():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    parent, child = make_request("p", 6), make_request("c", 6)
    kv.allocate_slots(parent, 6)  # [1, 2]
    parent.num_computed_tokens = 6
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens  # the scheduler sets it
    filler = make_request("f", 28)
    assert kv.allocate_slots(filler, 28) == [[3, 4, 5, 6, 7, 8, 9]]
    # Tokens 6..8: a copy of block 2 and one new block, but only one block is free.
    before = snapshot(kv.pool)
    assert kv.allocate_slots(parent, 3) is None
    assert parent.block_tables[0] == [1, 2]
    assert snapshot(kv.pool) == before
    assert kv.take_blocks_to_copy() == []
    kv.free(filler)  # free queue: 10, 9, 8, ..., 3
    assert kv.allocate_slots(parent, 3) == [[9]]
    assert parent.block_tables[0] == [1, 10, 9]
    assert kv.take_blocks_to_copy() == [(2, 10)]
    kv.check_invariants([parent, child, filler])


def test_manager_copy_on_write_without_free_block_returns_none():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    parent, child = make_request("p", 6), make_request("c", 6)
    kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens  # the scheduler sets it
    filler = make_request("f", 32)
    kv.allocate_slots(filler, 32)
    assert kv.pool.num_free_blocks == 0
    assert kv.allocate_slots(parent, 1) is None  # the copy needs a block
    assert parent.block_tables[0] == [1, 2]
    assert kv.take_blocks_to_copy() == []
    kv.check_invariants([parent, child, filler])


def test_manager_allocate_with_computed_prefix_forks_it():
    kv = KVCacheManager(make_pool(), enable_prefix_caching=False)
    donor = make_request("d", 8)
    kv.allocate_slots(donor, 8)  # [1, 2]
    a = make_request("a", 10)
    hit = PrefixMatch([[1, 2]], 8)
    assert kv.allocate_slots(a, 2, hit) == [[3]]
    assert a.block_tables[0] == [1, 2, 3]
    assert ref_cnts(kv.pool)[:4] == [0, 2, 2, 1]
    kv.check_invariants([donor, a])


