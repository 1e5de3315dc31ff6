"""Tests for mlxpa.core.block_pool: exact block ids, free order, reference counts, fork /
copy-on-write, and a hypothesis state machine against a dict model.

Setup: ``block_size=4``, ``num_blocks=11`` (block 0 is the null block, so ids 1..10 can be handed
out), ``check_invariants()`` after every operation.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool, NoFreeBlocksError
from mlxpa.utils import cdiv
from tests.core.pool_helpers import BS, NB, USABLE, make_pool, ref_cnts, snapshot

# ----------------------------------------------------------------------------- BlockPool basics


def test_cdiv():
    assert [cdiv(n, BS) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


@pytest.mark.parametrize(("num_blocks", "block_size"), [(1, 4), (0, 4), (2, 0), (11, -1)])
def test_pool_rejects_bad_sizes(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockPool(num_blocks, block_size)


def test_pool_smallest_has_one_usable_block():
    pool = BlockPool(2, 1)
    assert pool.num_usable_blocks == 1
    assert pool.allocate(1) == [1]
    assert pool.num_free_blocks == 0
    pool.check_invariants([[1]])


def test_initial_state():
    pool = make_pool()
    assert pool.num_blocks == NB and pool.block_size == BS
    assert pool.num_free_blocks == USABLE
    assert pool.num_usable_blocks == USABLE
    assert pool.usage == 0.0
    assert ref_cnts(pool) == [0] * NB
    pool.check_invariants([])


def test_allocate_exact_ids_in_order():
    pool = make_pool()
    a = pool.allocate(3)
    assert a == [1, 2, 3]
    pool.check_invariants([a])
    b = pool.allocate(2)
    assert b == [4, 5]
    pool.check_invariants([a, b])
    assert ref_cnts(pool) == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert pool.num_free_blocks == 5
    assert pool.usage == 0.5


def test_allocate_zero_changes_nothing():
    pool = make_pool()
    before = snapshot(pool)
    assert pool.allocate(0) == []
    assert snapshot(pool) == before
    pool.check_invariants([])


def test_allocate_every_block_never_hands_out_null():
    pool = make_pool()
    ids = pool.allocate(USABLE)
    assert ids == list(range(1, NB))
    assert NULL_BLOCK not in ids
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    assert pool.ref_cnt(NULL_BLOCK) == 0
    pool.check_invariants([ids])


def test_no_free_blocks_error_leaves_state_unchanged():
    pool = make_pool()
    a = pool.allocate(3)
    before = snapshot(pool)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(8)
    assert snapshot(pool) == before
    pool.check_invariants([a])
    # Nothing was taken: the next allocation still starts at block 4.
    assert pool.allocate(7) == [4, 5, 6, 7, 8, 9, 10]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)


def test_no_free_blocks_error_is_a_runtime_error():
    assert issubclass(NoFreeBlocksError, RuntimeError)


def test_free_appends_to_tail_in_given_order():
    pool = make_pool()
    a = pool.allocate(3)  # [1, 2, 3]; free queue now 4..10
    pool.free([2, 3, 1])
    assert pool.num_free_blocks == USABLE
    pool.check_invariants([])
    assert pool.free_queue() == [4, 5, 6, 7, 8, 9, 10, 2, 3, 1]
    # Blocks already free come first; the freed ones follow in the order they were given.
    assert pool.allocate(USABLE) == [4, 5, 6, 7, 8, 9, 10, 2, 3, 1]
    del a


def test_free_of_full_pool_reverses_reuse():
    pool = make_pool()
    ids = pool.allocate(USABLE)
    pool.free(reversed(ids))
    pool.check_invariants([])
    assert pool.allocate(3) == [10, 9, 8]


def test_free_shared_block_drops_one_reference():
    pool = make_pool()
    t = pool.allocate(2)  # [1, 2]
    pool.incref([1])
    assert pool.ref_cnt(1) == 2
    pool.check_invariants([t, [1]])
    pool.free([1, 2])
    assert pool.ref_cnt(1) == 1 and pool.ref_cnt(2) == 0
    assert pool.free_queue()[-1] == 2
    pool.check_invariants([[1]])
    pool.free([1])
    assert pool.free_queue()[-2:] == [2, 1]
    pool.check_invariants([])


@pytest.mark.parametrize("bad", [[NULL_BLOCK], [5], [1, 1]])
def test_free_asserts_on_null_unallocated_or_double_free(bad):
    pool = make_pool()
    pool.allocate(1)  # [1]
    with pytest.raises(AssertionError):
        pool.free(bad)


@pytest.mark.parametrize("bad", [[NULL_BLOCK], [5]])
def test_incref_asserts_on_null_or_free_block(bad):
    pool = make_pool()
    pool.allocate(1)
    with pytest.raises(AssertionError):
        pool.incref(bad)


# ----------------------------------------------------------------------------- fork and CoW


def test_fork_shares_every_block():
    pool = make_pool()
    parent = pool.allocate(3)
    child = pool.fork(parent)
    assert child == [1, 2, 3] and child is not parent
    assert ref_cnts(pool)[:5] == [0, 2, 2, 2, 0]
    assert pool.num_free_blocks == 7  # forking takes no block
    pool.check_invariants([parent, child])
    grandchild = pool.fork(child)
    assert ref_cnts(pool)[:5] == [0, 3, 3, 3, 0]
    pool.check_invariants([parent, child, grandchild])
    pool.free(child)
    assert ref_cnts(pool)[:5] == [0, 2, 2, 2, 0]
    pool.check_invariants([parent, grandchild])
    pool.free(parent)
    pool.free(grandchild)
    assert pool.num_free_blocks == USABLE
    pool.check_invariants([])


def test_fork_empty_table():
    pool = make_pool()
    assert pool.fork([]) == []
    pool.check_invariants([])


def test_copy_on_write_unshared_returns_none():
    pool = make_pool()
    t = pool.allocate(2)
    before = snapshot(pool)
    assert pool.copy_on_write(t, 1) is None
    assert t == [1, 2]
    assert snapshot(pool) == before
    pool.check_invariants([t])


def test_copy_on_write_shared_replaces_entry():
    pool = make_pool()
    parent = pool.allocate(2)  # [1, 2]
    child = pool.fork(parent)
    assert pool.copy_on_write(child, 1) == (2, 3)
    assert child == [1, 3]
    assert parent == [1, 2]
    assert ref_cnts(pool)[:5] == [0, 2, 1, 1, 0]
    pool.check_invariants([parent, child])
    # The old block is now exclusively the parent's: no copy for it.
    assert pool.copy_on_write(parent, 1) is None
    assert parent == [1, 2]
    # A second CoW of the child's fresh block is not needed either.
    assert pool.copy_on_write(child, 1) is None
    pool.check_invariants([parent, child])


def test_copy_on_write_three_owners():
    pool = make_pool()
    a = pool.allocate(1)  # [1]
    b = pool.fork(a)
    c = pool.fork(a)
    assert pool.copy_on_write(b, 0) == (1, 2)
    assert pool.ref_cnt(1) == 2
    pool.check_invariants([a, b, c])
    assert pool.copy_on_write(c, 0) == (1, 3)
    assert pool.ref_cnt(1) == 1
    assert (a, b, c) == ([1], [2], [3])
    pool.check_invariants([a, b, c])


def test_copy_on_write_without_free_block_raises_and_changes_nothing():
    pool = make_pool()
    parent = pool.allocate(USABLE)
    child = pool.fork(parent[:2])
    before = snapshot(pool)
    with pytest.raises(NoFreeBlocksError):
        pool.copy_on_write(child, 1)
    assert child == [1, 2]
    assert snapshot(pool) == before
    pool.check_invariants([parent, child])


# ----------------------------------------------------------------------------- check_invariants


def test_check_invariants_catches_allocated_block_with_zero_count():
    pool = make_pool()
    t = pool.allocate(2)
    pool._ref_cnt[2] = 0  # neither free nor referenced: a leaked block
    with pytest.raises(AssertionError):
        pool.check_invariants()
    del t


def test_check_invariants_catches_free_block_with_count():
    pool = make_pool()
    pool._ref_cnt[7] = 1  # referenced but still in the free queue
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_check_invariants_catches_negative_count():
    pool = make_pool()
    pool.allocate(1)
    pool._ref_cnt[1] = -1
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_check_invariants_catches_duplicate_in_free_queue():
    pool = make_pool()
    pool._free[0].append(3)
    with pytest.raises(AssertionError, match="duplicate"):
        pool.check_invariants()


def test_check_invariants_catches_null_block_in_free_queue():
    pool = make_pool()
    pool._free[0].append(NULL_BLOCK)
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_check_invariants_catches_referenced_null_block():
    pool = make_pool()
    pool._ref_cnt[NULL_BLOCK] = 1
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_check_invariants_catches_counts_differing_from_holders():
    pool = make_pool()
    t = pool.allocate(2)
    child = pool.fork(t)
    pool.check_invariants([t, child])
    with pytest.raises(AssertionError, match="holders"):
        pool.check_invariants([t])  # one holder forgotten
    with pytest.raises(AssertionError, match="holders"):
        pool.check_invariants([t, child, [1]])  # one holder too many
    with pytest.raises(AssertionError, match="holders"):
        pool.check_invariants([t, child, [NULL_BLOCK]])  # the null block is never held
    pool._ref_cnt[1] += 1  # consistent with the free queue, but not with the holders
    pool.check_invariants()
    with pytest.raises(AssertionError, match="holders"):
        pool.check_invariants([t, child])


def test_check_invariants_catches_foreign_id_in_free_queue():
    pool = make_pool()
    pool._free[0].append(NB)  # no such block; allocate() would hand it out later
    with pytest.raises(AssertionError):
        pool.check_invariants()

# ----------------------------------------------------------------------------- state machine


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / copy_on_write / free against a plain-dict model.

    The model keeps its own free list (FIFO: allocate takes the head, free appends to the tail)
    and reference counts, so every block id the pool hands out is predicted exactly.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NB, BS)
        self.tables: dict[int, list[int]] = {}
        self.next_name = 0
        self.model_free: list[int] = list(range(1, NB))
        self.model_ref: dict[int, int] = {}

    # model helpers
    def _model_take(self, n: int) -> list[int]:
        ids, self.model_free = self.model_free[:n], self.model_free[n:]
        for b in ids:
            assert b not in self.model_ref
            self.model_ref[b] = 1
        return ids

    def _model_drop(self, ids: list[int]) -> None:
        for b in ids:
            self.model_ref[b] -= 1
            if self.model_ref[b] == 0:
                del self.model_ref[b]
                self.model_free.append(b)

    def _pick(self, i: int) -> int:
        names = sorted(self.tables)
        return names[i % len(names)]

    @rule(n=st.integers(0, 5))
    def allocate(self, n):
        if n > len(self.model_free):
            before = snapshot(self.pool)
            with pytest.raises(NoFreeBlocksError):
                self.pool.allocate(n)
            assert snapshot(self.pool) == before
            return
        ids = self.pool.allocate(n)
        assert ids == self._model_take(n)
        self.tables[self.next_name] = ids
        self.next_name += 1

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 100))
    def append(self, i):
        table = self.tables[self._pick(i)]
        if not self.model_free:
            with pytest.raises(NoFreeBlocksError):
                self.pool.allocate(1)
            return
        new = self.pool.allocate(1)
        assert new == self._model_take(1)
        table.extend(new)

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.tables[self._pick(i)]
        child = self.pool.fork(parent)
        assert child == parent and child is not parent
        for b in child:
            self.model_ref[b] += 1
        self.tables[self.next_name] = child
        self.next_name += 1

    @precondition(lambda self: any(self.tables.values()))
    @rule(i=st.integers(0, 100), j=st.integers(0, 100))
    def copy_on_write(self, i, j):
        names = [name for name in sorted(self.tables) if self.tables[name]]
        table = self.tables[names[i % len(names)]]
        index = j % len(table)
        src = table[index]
        if self.model_ref[src] == 1:
            assert self.pool.copy_on_write(table, index) is None
            assert table[index] == src
        elif not self.model_free:
            before, old = snapshot(self.pool), list(table)
            with pytest.raises(NoFreeBlocksError):
                self.pool.copy_on_write(table, index)
            assert snapshot(self.pool) == before and table == old
        else:
            (dst,) = self._model_take(1)
            self.model_ref[src] -= 1  # stays >= 1: the block was shared
            assert self.pool.copy_on_write(table, index) == (src, dst)
            assert table[index] == dst

    @precondition(lambda self: self.tables)
    @rule(i=st.integers(0, 100), tail_first=st.booleans())
    def free(self, i, tail_first):
        table = self.tables.pop(self._pick(i))
        order = list(reversed(table)) if tail_first else table
        self.pool.free(order)
        self._model_drop(order)

    @invariant()
    def consistent(self):
        self.pool.check_invariants(self.tables.values())
        assert self.pool.free_queue() == self.model_free
        assert self.pool.num_free_blocks == len(self.model_free)
        for b in range(NB):
            assert self.pool.ref_cnt(b) == self.model_ref.get(b, 0)
        held = {b for t in self.tables.values() for b in t}
        assert held == set(self.model_ref)
        # No leak: every usable block is either free or referenced, never both.
        assert held.isdisjoint(self.model_free)
        assert held | set(self.model_free) == set(range(1, NB))

    def teardown(self):
        for name in sorted(self.tables):
            self.pool.free(reversed(self.tables[name]))
        self.tables.clear()
        self.pool.check_invariants([])
        assert self.pool.num_free_blocks == USABLE
        assert sorted(self.pool.free_queue()) == list(range(1, NB))


BlockPoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40,
                                              deadline=None)
TestBlockPoolMachine = BlockPoolMachine.TestCase
