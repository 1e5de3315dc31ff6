"""Tests for mlxpa.core.radix_cache: exact block ids on a tiny pool, and a hypothesis state machine
checked against a dict model of the tree."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mlxpa.core.block_pool import BlockPool
from mlxpa.core.radix_cache import RadixCache, RadixNode
from mlxpa.utils import cdiv

BS = 4


def make_cache(num_blocks: int = 11) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(num_blocks, BS)
    return pool, RadixCache(pool, BS)


def blk(*firsts: int) -> list[int]:
    """One 4-token block per argument: ``blk(1, 5)`` is ``[1, 1, 1, 1, 5, 5, 5, 5]``."""
    return [t for f in firsts for t in [f] * BS]


def contents(cache: RadixCache) -> dict[tuple[int, ...], int]:
    """Every block-aligned prefix in the tree -> the block holding its last block (no refresh)."""
    out, stack = {}, [(c, ()) for c in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        for j, b in enumerate(node.value[0]):
            out[prefix + node.key[:(j + 1) * BS]] = b
        stack.extend((c, prefix + node.key) for c in node.children.values())
    return out


def check(pool: BlockPool, cache: RadixCache, *tables: list[int]) -> None:
    cache.check_invariants()
    pool.check_invariants([cache.blocks(), *tables])


# ----------------------------------------------------------------------------- match / insert


def test_match_insert_split():
    pool, cache = make_cache()
    table = pool.allocate(3)
    assert table == [1, 2, 3]
    assert cache.insert(blk(1, 2, 3), [table]) == 0
    assert [pool.ref_cnt(b) for b in table] == [2, 2, 2]
    assert (cache.total_blocks, cache.evictable_blocks, cache.protected_blocks) == (3, 3, 0)
    check(pool, cache, table)

    m = cache.match_prefix(blk(1, 2, 3) + [9])
    assert (m.block_ids[0], m.num_tokens, m.last_node.key) == ([1, 2, 3], 12, tuple(blk(1, 2, 3)))
    assert cache.match_prefix(blk(1)[:3])[:3] == ([[]], 0, cache.root)  # partial block ignored
    assert cache.match_prefix(blk(7, 1)).last_node is cache.root

    m = cache.match_prefix(blk(1, 2, 9))  # ends inside the node: split after 2 blocks
    assert (m.block_ids[0], m.num_tokens, m.last_node.key) == ([1, 2], 8, tuple(blk(1, 2)))
    (child,) = m.last_node.children.values()
    assert (child.key, child.value, child.parent) == (tuple(blk(3)), [[3]], m.last_node)
    check(pool, cache, table)

    m = cache.match_prefix(blk(1, 5))  # split again, after 1 block
    assert (m.block_ids[0], m.num_tokens) == ([1], 4)
    assert cache.pretty_print().splitlines() == [
        "root evictable=3 protected=0",
        "  [1, 1, 1, 1] blocks=[1] lock=0 t=4",
        "    [2, 2, 2, 2] blocks=[2] lock=0 t=3",
        "      [3, 3, 3, 3] blocks=[3] lock=0 t=2",
    ]
    assert cache.total_blocks == 3 and [pool.ref_cnt(b) for b in table] == [2, 2, 2]
    check(pool, cache, table)


def test_insert_returns_present_tokens_caller_frees_duplicates():
    pool, cache = make_cache()
    a = pool.allocate(2)
    assert cache.insert(blk(1, 2), [a]) == 0
    b = pool.allocate(4)  # a second request that computed the shared prefix itself
    assert b == [3, 4, 5, 6]
    assert cache.insert(blk(1, 2, 3, 4) + [9, 9], [b]) == 8
    assert [pool.ref_cnt(x) for x in b] == [1, 1, 2, 2]  # tree took refs of new blocks only
    check(pool, cache, a, b)
    # The caller swaps its duplicate blocks for the tree's.
    pool.free(reversed(b[:2]))
    b[:2] = pool.fork(cache.match_prefix(blk(1, 2)).block_ids[0])
    assert b == [1, 2, 5, 6] and pool.ref_cnt(1) == 3
    check(pool, cache, a, b)
    assert cache.insert(blk(1, 2, 3), [b]) == 12  # fully present: nothing taken
    assert cache.insert(blk(1, 2, 3, 4), [[4, 4, 4, 4]]) == 16
    assert cache.insert(blk(1)[:3], [[]]) == 0  # no full block
    assert cache.total_blocks == 4
    check(pool, cache, a, b)
    with pytest.raises(ValueError, match="need 2 blocks"):
        cache.insert(blk(7, 7), [[1]])
    with pytest.raises(ValueError, match="required"):
        cache.insert(blk(7), None)


# ----------------------------------------------------------------------------- lock / evict


def test_lock_protects_from_eviction():
    pool, cache = make_cache()
    cache.insert(blk(1, 2), [pool.allocate(2)])
    cache.insert(blk(1, 3), [pool.allocate(2)])  # dup block 3 stays with the caller
    cache.insert(blk(5), [pool.allocate(1)])
    m = cache.match_prefix(blk(1, 2))
    cache.lock(m.last_node)
    cache.lock(m.last_node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (2, 2)
    assert m.last_node.lock_ref == 2 and m.last_node.parent.lock_ref == 2
    assert cache.evict(10) == 2  # the [1, 3] leaf and [5]; the locked path stays
    assert contents(cache) == {tuple(blk(1)): 1, tuple(blk(1, 2)): 2}
    cache.check_invariants()
    cache.unlock(m.last_node)
    assert cache.evict(10) == 0 and cache.protected_blocks == 2
    cache.unlock(m.last_node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (2, 0)
    assert cache.evict(10) == 2 and cache.total_blocks == 0
    cache.check_invariants()


def test_lru_eviction_order_exact():
    pool, cache = make_cache()
    for f in (1, 2, 3):
        table = pool.allocate(1)
        cache.insert(blk(f), [table])
        pool.free(table)  # the request finished: only the tree holds the block
    cache.match_prefix(blk(1))  # 1 is now the most recently used
    order = []
    for _ in range(3):
        before = set(cache.blocks())
        assert cache.evict(1) == 1
        (gone,) = before - set(cache.blocks())
        order.append(gone)
        assert pool.ref_cnt(gone) == 0
        check(pool, cache)
    assert order == [2, 3, 1]
    assert cache.evict(1) == 0 and pool.num_free_blocks == 10


def test_evict_trims_leaf_tail_and_cascades_to_parent():
    pool, cache = make_cache()
    a = pool.allocate(3)
    cache.insert(blk(1, 2, 3), [a])
    assert cache.evict(1) == 1  # the leaf loses its last block only
    assert contents(cache) == {tuple(blk(1)): 1, tuple(blk(1, 2)): 2}
    b = pool.allocate(2)
    assert b == [4, 5] and cache.insert(blk(1, 4), [b]) == 4  # splits [1, 2] after [1]
    c = pool.allocate(1)
    cache.insert(blk(5), [c])  # newest leaf
    # Leaves by age: [2] (oldest), [4], [5]. The parent [1], touched by the second insert
    # before [5] existed, becomes a leaf once its children are gone and goes before [5].
    assert cache.evict(3) == 3
    assert contents(cache) == {tuple(blk(5)): 6}
    assert [pool.ref_cnt(x) for x in a + b + c] == [1, 1, 1, 1, 1, 2]  # requests hold them
    check(pool, cache, a, b, c)


def test_evicted_block_is_free_only_when_no_request_holds_it():
    pool, cache = make_cache()
    table = pool.allocate(3)
    cache.insert(blk(1, 2) + [3], [table])  # the partial block 3 is never cached
    assert cache.evict(5) == 2
    assert [pool.ref_cnt(b) for b in table] == [1, 1, 1] and pool.num_free_blocks == 7
    check(pool, cache, table)
    pool.free(reversed(table))
    assert pool.num_free_blocks == 10

    table = pool.allocate(2)
    cache.insert(blk(1, 2), [table])
    pool.free(reversed(table))  # request done first: the tree's reference keeps them
    assert pool.num_free_blocks == 8
    assert cache.evict(2) == 2 and pool.num_free_blocks == 10
    check(pool, cache)


def test_reset_drops_tree_references():
    pool, cache = make_cache()
    table = pool.allocate(2)
    cache.insert(blk(1, 2), [table])
    cache.reset()
    assert cache.total_blocks == 0 and [pool.ref_cnt(b) for b in table] == [1, 1]
    check(pool, cache, table)
    assert cache.match_prefix(blk(1, 2)).num_tokens == 0


def test_simulated_tree():
    cache = RadixCache(None, BS)
    assert cache.insert(blk(1, 2, 3)) == 0
    assert cache.insert(blk(1, 2, 4)) == 8
    assert cache.insert(blk(6), [[42]]) == 0
    assert cache.match_prefix(blk(1, 2, 4)) [:2] == ([[1, 2, 4]], 12)
    assert cache.match_prefix(blk(6, 6)).block_ids[0] == [42]
    assert cache.total_blocks == 5
    m = cache.match_prefix(blk(1, 2, 3))
    cache.lock(m.last_node)
    assert cache.evict(10) == 2 and cache.total_blocks == 3
    cache.check_invariants()
    cache.unlock(m.last_node)
    cache.reset()
    assert cache.total_blocks == 0
    with pytest.raises(ValueError, match="pool.block_size"):
        RadixCache(BlockPool(4, 8), BS)


# ----------------------------------------------------------------------------- state machine


@dataclass
class Holder:
    tokens: list[int]
    table: list[int]  # one pool reference per block
    node: RadixNode  # locked
    num_cached: int  # blocks of ``table`` that are the tree's (the locked path)


class RadixMachine(RuleBasedStateMachine):
    """Requests match, lock, allocate, insert and free over an 11-block pool; a dict of
    block-aligned prefix -> block id models the tree."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.cache = make_cache()
        self.model: dict[tuple[int, ...], int] = {}
        self.holders: list[Holder] = []

    def model_match(self, tokens: list[int]) -> list[int]:
        ids = []
        while len(tokens) >= (len(ids) + 1) * BS and \
                (b := self.model.get(tuple(tokens[:(len(ids) + 1) * BS]))) is not None:
            ids.append(b)
        return ids

    def sync_after_evict(self, evicted: int) -> None:
        tree = contents(self.cache)
        assert all(self.model.get(p) == b for p, b in tree.items())
        gone = set(self.model) - set(tree)
        assert len(gone) == evicted
        locked = [tuple(h.tokens[:h.num_cached * BS]) for h in self.holders]
        assert not any(lp[:len(p)] == p for p in gone for lp in locked)
        self.model = tree

    tokens = st.lists(st.integers(0, 1), max_size=14)

    @precondition(lambda self: len(self.holders) < 4)
    @rule(tokens=tokens)
    def admit(self, tokens):
        m = self.cache.match_prefix(tokens)
        assert m.block_ids[0] == self.model_match(tokens)
        assert m.num_tokens == len(m.block_ids[0]) * BS
        self.cache.lock(m.last_node)
        need = cdiv(len(tokens), BS) - len(m.block_ids[0])
        if need > self.pool.num_free_blocks:
            short, before = need - self.pool.num_free_blocks, self.cache.evictable_blocks
            evicted = self.cache.evict(short)
            assert evicted == min(short, before)
            self.sync_after_evict(evicted)
        if need > self.pool.num_free_blocks:
            self.cache.unlock(m.last_node)
            return
        table = self.pool.fork(m.block_ids[0]) + self.pool.allocate(need)
        self.holders.append(Holder(list(tokens), table, m.last_node, len(m.block_ids[0])))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def cache_blocks(self, data):
        h = data.draw(st.sampled_from(self.holders))
        assert h.table[:h.num_cached] == self.model_match(h.tokens)[:h.num_cached]
        present_blocks = len(self.model_match(h.tokens))
        for j in range(h.num_cached, present_blocks):  # the tree takes the caller's block
            prefix = tuple(h.tokens[:(j + 1) * BS])     # where no request holds its own
            if self.pool.ref_cnt(self.model[prefix]) == 1:
                self.model[prefix] = h.table[j]
        assert self.cache.insert(h.tokens, [h.table], h.num_cached) == present_blocks * BS
        for j in range(present_blocks, len(h.tokens) // BS):
            self.model[tuple(h.tokens[:(j + 1) * BS])] = h.table[j]
        m = self.cache.match_prefix(h.tokens)
        for j in range(h.num_cached, present_blocks):  # swap own duplicates for the tree's
            self.pool.free([h.table[j]])
            h.table[j] = self.pool.fork([m.block_ids[0][j]])[0]
        assert h.table[:len(h.tokens) // BS] == m.block_ids[0]
        self.cache.lock(m.last_node)
        self.cache.unlock(h.node)
        h.node, h.num_cached = m.last_node, len(m.block_ids[0])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data):
        h = data.draw(st.sampled_from(self.holders))
        self.cache.unlock(h.node)
        self.pool.free(reversed(h.table))
        self.holders.remove(h)

    @rule(n=st.integers(0, 6))
    def evict(self, n):
        before = self.cache.evictable_blocks
        evicted = self.cache.evict(n)
        assert evicted == min(n, before)
        self.sync_after_evict(evicted)

    @rule(tokens=tokens)
    def match(self, tokens):
        m = self.cache.match_prefix(tokens)
        assert m.block_ids[0] == self.model_match(tokens)

    @precondition(lambda self: not self.holders)
    @rule()
    def reset(self):
        self.cache.reset()
        self.model = {}
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks

    @invariant()
    def consistent(self):
        check(self.pool, self.cache, *(h.table for h in self.holders))
        assert contents(self.cache) == self.model
        locked = [tuple(h.tokens[:h.num_cached * BS]) for h in self.holders]
        protected = sum(any(lp[:len(p)] == p for lp in locked) for p in self.model)
        assert self.cache.protected_blocks == protected
        assert self.cache.total_blocks == len(self.model)

    def teardown(self):
        for h in self.holders:
            self.cache.unlock(h.node)
            self.pool.free(reversed(h.table))
        assert self.cache.protected_blocks == 0
        assert self.cache.evict(self.cache.total_blocks + 1) == len(self.model)
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks
        self.cache.check_invariants()


RadixMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                          deadline=None)
TestRadixMachine = RadixMachine.TestCase
