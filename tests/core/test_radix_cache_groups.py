"""The radix tree over KV cache groups (mlxpa.core.radix_cache): a hit needs the window before
its end in each sliding-window group and, with recurrent layers, a snapshot at its end;
droppable blocks become idle when no request holds them, are dropped least recently used first
against unlocked leaves, and tombstones heal. Exact block ids on a tiny pool; the tree's and
the pool's invariants after every step."""

from __future__ import annotations

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool
from mlxpa.core.radix_cache import RadixCache

BS = 4
W = 8  # a query at position L reads keys L - 7 .. L: blocks (L - 7) // 4 .. L // 4


def blk(*firsts: int) -> list[int]:
    return [t for f in firsts for t in [f] * BS]


def make(windows=(None, W), recurrent=False, num_blocks=31):
    pool = BlockPool(num_blocks, BS)
    return pool, RadixCache(pool, BS, windows, recurrent)


def check(pool, tree, *held):
    tree.check_invariants()
    pool.check_invariants([tree.blocks(), *held])


def release(pool, tree, blocks):
    """A request drops its reference of ``blocks`` (the window passed them)."""
    pool.free(blocks)
    tree.release(blocks)


def test_a_hit_needs_the_window_before_its_end():
    pool, tree = make()
    full, window = pool.allocate(5), pool.allocate(5)  # [1..5], [6..10]
    tokens = blk(1, 2, 3, 4, 5)
    assert tree.insert(tokens, [full, window]) == 0
    node = tree.node_for(tokens)
    tree.lock(node)  # the request that holds them runs on
    held = [full, window]
    check(pool, tree, *held)
    assert tree.evictable_blocks == 0
    # The window passes blocks 6, 7: idle (the tree alone holds them), evictable though the
    # node is locked.
    release(pool, tree, [6, 7])
    held = [full, [8, 9, 10]]
    assert tree.evictable == [0, 2, 0] and tree.protected_blocks == 8
    check(pool, tree, *held)
    m = tree.match_prefix(tokens + [9])
    assert (m.block_ids, m.num_tokens) == ([full, [0, 0, 0, 9, 10]], 20)
    # Evict one: the block idle longest (6) becomes a tombstone; the hit is unchanged.
    assert tree.evict(1) == 1 and node.value[1] == [0, 7, 8, 9, 10]
    assert pool.ref_cnt(6) == 0
    check(pool, tree, *held)
    release(pool, tree, [9])
    held = [full, [8, 10]]
    assert tree.evict(2) == 2 and node.value[1] == [0, 0, 8, 0, 10]
    check(pool, tree, *held)
    # Block 3's tombstone is in the window of a hit at 5 or 4 blocks; at 3 blocks the window
    # reads blocks 1 and 2, at 2 and 1 block block 0: no hit.
    m = tree.match_prefix(tokens + [9])
    assert (m.block_ids, m.num_tokens, m.last_node) == ([[], []], 0, tree.root)
    # A request that computed the prefix again fills the tombstones with its blocks; 8 and
    # 10 stay the tree's (the first request holds them).
    again = [full, [11, 12, 13, 14, 15]]
    pool.allocate(5)  # 11..15
    assert tree.insert(tokens, again) == 20
    assert node.value[1] == [11, 12, 8, 14, 10] and pool.ref_cnt(13) == 1
    check(pool, tree, *held, again[1])
    # Where no request holds the tree's block, the caller's takes its place: the first
    # request's window passes 8, a third computes the prefix again.
    release(pool, tree, [8])
    third = [full, [16, 17, 18, 19, 20]]
    pool.allocate(5)  # 16..20
    tree.insert(tokens, third)
    assert node.value[1] == [11, 12, 18, 14, 10] and pool.ref_cnt(8) == 0
    check(pool, tree, full, [10], again[1], third[1])
    m = tree.match_prefix(tokens + [9])
    assert (m.block_ids, m.num_tokens) == ([full, [0, 0, 0, 14, 10]], 20)


def test_idle_blocks_and_leaves_go_least_recently_used_first():
    pool, tree = make()
    a = [pool.allocate(2), pool.allocate(2)]   # [1, 2], [3, 4]
    tree.insert(blk(1, 2), a)
    release(pool, tree, [b for t in a for b in t])  # request a finished: an unlocked leaf
    b = [pool.allocate(2), pool.allocate(2)]   # [5, 6], [7, 8]
    tree.insert(blk(3, 4), b)
    tree.lock(tree.node_for(blk(3, 4)))  # request b runs on; its window passes block 7
    release(pool, tree, [7])
    check(pool, tree, [5, 6, 8])
    # The leaf [1, 2] (last used before block 7 went idle) goes first, tail first: its
    # position 1 (blocks 2 and 4), then position 0; then the idle block 7.
    assert tree.evict(2) == 2 and pool.ref_cnt(2) == pool.ref_cnt(4) == 0
    assert tree.evict(2) == 2 and tree.match_prefix(blk(1, 2)).num_tokens == 0
    assert pool.ref_cnt(7) == 1
    assert tree.evict(1) == 1 and pool.ref_cnt(7) == 0
    assert tree.node_for(blk(3, 4)).value == [[5, 6], [0, 8]]
    assert tree.evict(5) == 0  # the rest is b's
    check(pool, tree, [5, 6, 8])


def test_a_recurrent_hit_ends_at_a_snapshot():
    pool, tree = make(windows=(None,), recurrent=True)
    full = pool.allocate(3)
    tokens = blk(1, 2, 3)
    tree.insert(tokens, [full])
    assert tree.match_prefix(tokens + [9]).num_tokens == 0  # no snapshot: no hit
    snap = pool.allocate(2)  # the state after 2 blocks, in 2 blocks of the pool
    assert tree.attach_snapshot(tokens[:8], snap)  # splits the node after 2 blocks
    assert not tree.attach_snapshot(tokens[:8], [99])  # one snapshot a node
    release(pool, tree, full)  # the request finished
    check(pool, tree)
    m = tree.match_prefix(tokens + [9])
    assert (m.block_ids, m.num_tokens, m.snapshot) == ([full[:2]], 8, snap)
    assert m.last_node.snapshot == snap and m.last_node.value == [full[:2]]
    # Unlocked: the leaf after the snapshot goes first, then the snapshot (dropped whole, no
    # longer a hit), then the blocks.
    assert tree.evict(1) == 1 and tree.match_prefix(tokens).num_tokens == 8
    assert tree.evict(1) == 2 and tree.match_prefix(tokens).num_tokens == 0
    assert pool.ref_cnt(snap[0]) == pool.ref_cnt(snap[1]) == 0
    assert tree.evict(10) == 2 and pool.num_free_blocks == pool.num_usable_blocks
    check(pool, tree)


def test_a_model_without_kv_keeps_only_snapshots():
    pool, tree = make(windows=(), recurrent=True, num_blocks=4)
    tokens = blk(1, 2, 3)
    assert tree.insert(tokens, []) == 0 and tree.total_blocks == 0
    snap = pool.allocate(1)
    assert tree.attach_snapshot(tokens, snap)
    m = tree.match_prefix(tokens + blk(4))
    assert (m.block_ids, m.num_tokens, m.snapshot) == ([], 12, snap)
    assert tree.evict(1) == 1 and pool.ref_cnt(snap[0]) == 0
    assert tree.match_prefix(tokens + blk(4)).num_tokens == 0
    check(pool, tree)
    assert NULL_BLOCK == 0
