"""Tests for the radix tree's ``cache_salt`` namespaces: a hit needs the same salt, identical
tokens under two salts are two paths over two sets of blocks, one LRU evicts across
namespaces, an emptied salted root goes; and a hypothesis state machine checked against a
dict model keyed by ``(salt, prefix)``."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mlxpa.core.block_pool import BlockPool
from mlxpa.core.radix_cache import RadixCache, RadixNode
from mlxpa.utils import cdiv
from tests.core.test_radix_cache import BS, blk, check, make_cache


def contents(cache: RadixCache) -> dict[tuple[str | None, tuple[int, ...]], int]:
    """``(salt, block-aligned prefix)`` -> the block holding its last block, every namespace."""
    out = {}
    for root in cache.roots():
        stack = [(c, ()) for c in root.children.values()]
        while stack:
            node, prefix = stack.pop()
            assert node.cache_salt == root.cache_salt
            for j, b in enumerate(node.value[0]):
                out[root.cache_salt, prefix + node.key[:(j + 1) * BS]] = b
            stack.extend((c, prefix + node.key) for c in node.children.values())
    return out


def insert_done(pool: BlockPool, cache: RadixCache, tokens: list[int],
                salt: str | None) -> list[int]:
    """A request that computed ``tokens`` under ``salt``, cached them and finished."""
    table = pool.allocate(len(tokens) // BS)
    cache.insert(tokens, [table], cache_salt=salt)
    pool.free(reversed(table))
    return table


def test_a_hit_needs_the_same_salt():
    pool, cache = make_cache()
    a = insert_done(pool, cache, blk(1, 2, 3), "alice")
    assert cache.match_prefix(blk(1, 2, 3, 4), "alice")[:2] == ([a], 12)
    for other in ("bob", None, "alice ", "Alice"):
        m = cache.match_prefix(blk(1, 2, 3, 4), other)
        assert (m.block_ids, m.num_tokens) == ([[]], 0), other
        assert cache.num_cached_blocks(blk(1, 2, 3), other) == 0
    assert cache.match_prefix(blk(1, 2), "bob").last_node is None  # no namespace: no node
    assert cache.match_prefix(blk(1, 2)).last_node is cache.root  # the unsalted one's root
    assert cache.num_cached_blocks(blk(1, 2, 3), "alice") == 3
    # the unsalted namespace is one more namespace: a salted request misses its blocks too
    u = insert_done(pool, cache, blk(1, 2), None)
    assert cache.match_prefix(blk(1, 2, 9))[:2] == ([u], 8)
    assert cache.match_prefix(blk(1, 2, 9), "bob").num_tokens == 0
    assert cache.match_prefix(blk(1, 2, 9), "alice")[:2] == ([a[:2]], 8)
    check(pool, cache)


def test_identical_tokens_under_two_salts_are_two_paths():
    pool, cache = make_cache()
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert cache.insert(blk(1, 2), [a], cache_salt="alice") == 0
    assert cache.insert(blk(1, 2), [b], cache_salt="bob") == 0  # nothing present under bob
    assert cache.insert(blk(1, 2), [b], cache_salt="alice") == 8  # alice has them: kept apart
    assert set(a).isdisjoint(b) and cache.total_blocks == 4
    assert cache.match_prefix(blk(1, 2, 3), "alice").block_ids == [a]
    assert cache.match_prefix(blk(1, 2, 3), "bob").block_ids == [b]
    alice, bob = cache.root_of("alice"), cache.root_of("bob")
    assert {alice.cache_salt, bob.cache_salt} == {"alice", "bob"} and alice is not bob
    assert cache.roots() == [cache.root, alice, bob]
    node = cache.node_for(blk(1, 2), "bob")
    assert node.cache_salt == "bob" and node.value == [b] and node.parent is bob
    check(pool, cache, a, b)
    text = cache.pretty_print()
    assert "alice" not in text and "bob" not in text  # a salt is a secret: only a digest
    assert text.splitlines()[1].startswith("root cache_salt=sha256:")
    assert len(text.splitlines()) == 5  # the top line, then two namespaces of one node each


def test_lock_protects_only_its_own_namespace():
    pool, cache = make_cache()
    insert_done(pool, cache, blk(1, 2), "alice")
    bob = insert_done(pool, cache, blk(1, 2), "bob")
    m = cache.match_prefix(blk(1, 2, 3), "alice")
    cache.lock(m.last_node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (2, 2)
    assert cache.evict(10) == 2 and [pool.ref_cnt(b) for b in bob] == [0, 0]
    assert cache.root_of("bob") is None  # emptied: its root went with its last leaf
    assert cache.match_prefix(blk(1, 2, 3), "alice").num_tokens == 8
    cache.unlock(m.last_node)
    check(pool, cache)


def test_one_lru_over_every_namespace():
    """Eviction takes the least recently used leaf whatever its salt; a match refreshes only
    its own namespace's path."""
    pool, cache = make_cache()
    owner = {}
    for first, salt in ((1, "a"), (1, "b"), (2, None), (3, "a"), (1, None)):
        (block,) = insert_done(pool, cache, blk(first), salt)
        owner[block] = (salt, first)
    cache.match_prefix(blk(1, 9), "a")  # ("a", 1) is now the most recently used
    order = []
    while cache.total_blocks:
        before = set(cache.blocks())
        assert cache.evict(1) == 1
        (gone,) = before - set(cache.blocks())
        order.append(owner[gone])
        check(pool, cache)
    assert order == [("b", 1), (None, 2), ("a", 3), (None, 1), ("a", 1)]
    assert cache.roots() == [cache.root] and pool.num_free_blocks == pool.num_usable_blocks


def test_splits_snapshots_and_reset_keep_the_namespace():
    pool = BlockPool(11, BS)
    cache = RadixCache(pool, BS, (None,), recurrent=True)
    a = pool.allocate(3)
    cache.insert(blk(1, 2, 3), [a], cache_salt="s")
    snap = pool.allocate(1)
    assert not cache.attach_snapshot(blk(1, 2), snap, "t")  # not cached under "t"
    assert not cache.attach_snapshot(blk(1, 2), snap)
    assert cache.attach_snapshot(blk(1, 2), snap, "s")  # splits "s"'s node after 2 blocks
    m = cache.match_prefix(blk(1, 2, 3, 4), "s")
    assert (m.num_tokens, m.snapshot, m.last_node.cache_salt) == (8, snap, "s")
    assert m.last_node.parent is cache.root_of("s")
    assert cache.match_prefix(blk(1, 2, 3, 4)).num_tokens == 0
    check(pool, cache, a)
    cache.reset()
    assert cache.roots() == [cache.root] and cache.total_blocks == 0
    assert cache.match_prefix(blk(1, 2, 3), "s").last_node is None
    check(pool, cache, a)


def test_simulated_tree_counts_each_salts_blocks():
    cache = RadixCache(None, BS)
    assert cache.insert(blk(1, 2, 3), cache_salt="x") == 0
    assert cache.insert(blk(1, 2, 4), cache_salt="y") == 0
    assert cache.insert(blk(1, 2, 4), cache_salt="x") == 8
    assert cache.total_blocks == 7
    assert cache.insert(blk(7)[:3], cache_salt="z") == 0 and cache.root_of("z") is None
    cache.check_invariants()


# ----------------------------------------------------------------------------- state machine

SALTS = (None, "a", "b")


@dataclass
class Holder:
    salt: str | None
    tokens: list[int]
    table: list[int]
    node: RadixNode | None  # locked (None: a miss in a namespace not made yet)
    num_cached: int


class SaltedRadixMachine(RuleBasedStateMachine):
    """Requests of three salts match, lock, allocate, insert and free over an 11-block pool;
    a dict of ``(salt, block-aligned prefix)`` -> block id models the tree. Every hit must
    be of the request's own salt, and blocks never sit in two namespaces."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.cache = make_cache()
        self.model: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.holders: list[Holder] = []

    def model_match(self, salt: str | None, tokens: list[int]) -> list[int]:
        ids = []
        while len(tokens) >= (len(ids) + 1) * BS and (b := self.model.get(
                (salt, tuple(tokens[:(len(ids) + 1) * BS])))) is not None:
            ids.append(b)
        return ids

    def lock(self, node: RadixNode | None) -> None:
        if node is not None:
            self.cache.lock(node)

    def unlock(self, node: RadixNode | None) -> None:
        if node is not None:
            self.cache.unlock(node)

    def sync_after_evict(self, evicted: int) -> None:
        tree = contents(self.cache)
        assert all(self.model.get(k) == b for k, b in tree.items())
        assert len(set(self.model) - set(tree)) == evicted
        self.model = tree

    tokens = st.lists(st.integers(0, 1), max_size=14)
    salts = st.sampled_from(SALTS)

    @precondition(lambda self: len(self.holders) < 4)
    @rule(salt=salts, tokens=tokens)
    def admit(self, salt, tokens):
        m = self.cache.match_prefix(tokens, salt)
        assert m.block_ids[0] == self.model_match(salt, tokens)
        assert m.last_node is None or m.last_node.cache_salt == salt
        self.lock(m.last_node)
        need = cdiv(len(tokens), BS) - len(m.block_ids[0])
        if need > self.pool.num_free_blocks:
            short, before = need - self.pool.num_free_blocks, self.cache.evictable_blocks
            evicted = self.cache.evict(short)
            assert evicted == min(short, before)
            self.sync_after_evict(evicted)
        if need > self.pool.num_free_blocks:
            self.unlock(m.last_node)
            return
        table = self.pool.fork(m.block_ids[0]) + self.pool.allocate(need)
        self.holders.append(Holder(salt, list(tokens), table, m.last_node, len(m.block_ids[0])))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def cache_blocks(self, data):
        h = data.draw(st.sampled_from(self.holders))
        present = len(self.model_match(h.salt, h.tokens))
        for j in range(h.num_cached, present):  # the tree takes the caller's block where
            key = (h.salt, tuple(h.tokens[:(j + 1) * BS]))  # no request holds its own
            if self.pool.ref_cnt(self.model[key]) == 1:
                self.model[key] = h.table[j]
        assert self.cache.insert(h.tokens, [h.table], h.num_cached, h.salt) == present * BS
        for j in range(present, len(h.tokens) // BS):
            self.model[h.salt, tuple(h.tokens[:(j + 1) * BS])] = h.table[j]
        m = self.cache.match_prefix(h.tokens, h.salt)
        for j in range(h.num_cached, present):  # swap own duplicates for the tree's
            self.pool.free([h.table[j]])
            h.table[j] = self.pool.fork([m.block_ids[0][j]])[0]
        assert h.table[:len(h.tokens) // BS] == m.block_ids[0]
        self.lock(m.last_node)
        self.unlock(h.node)
        h.node, h.num_cached = m.last_node, len(m.block_ids[0])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data):
        h = data.draw(st.sampled_from(self.holders))
        self.unlock(h.node)
        self.pool.free(reversed(h.table))
        self.holders.remove(h)

    @rule(n=st.integers(0, 6))
    def evict(self, n):
        before = self.cache.evictable_blocks
        evicted = self.cache.evict(n)
        assert evicted == min(n, before)
        self.sync_after_evict(evicted)

    @rule(salt=salts, tokens=tokens)
    def match(self, salt, tokens):
        assert self.cache.match_prefix(tokens, salt).block_ids[0] == self.model_match(salt,
                                                                                      tokens)
        assert self.cache.num_cached_blocks(tokens, salt) == len(self.model_match(salt, tokens))

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
        assert self.cache.total_blocks == len(self.model)
        salted = {s for s, _ in self.model if s is not None}
        assert {r.cache_salt for r in self.cache.roots()[1:]} == salted  # no empty namespace

    def teardown(self):
        for h in self.holders:
            self.unlock(h.node)
            self.pool.free(reversed(h.table))
        assert self.cache.evict(self.cache.total_blocks + 1) == len(self.model)
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks
        assert self.cache.roots() == [self.cache.root]
        self.cache.check_invariants()


SaltedRadixMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                                deadline=None)
TestSaltedRadixMachine = SaltedRadixMachine.TestCase
