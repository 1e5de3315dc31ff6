"""Tests for mlxpa.core.kv_disk over a simulated pool (block id -> bytes, no mlx): what is
written (hit blocks, not a unique prompt's; before a reused block is written again), what is
read back (the chain continued past the tree, exact bytes into fresh blocks, the hit's tokens),
sliding-window groups (only usable hits), salts, pool limits; ``check_invariants`` after
every request."""

from __future__ import annotations

from dataclasses import dataclass

from mlxpa.core.block_pool import NULL_BLOCK, BlockPool
from mlxpa.core.disk_cache import DiskStore, namespace_key
from mlxpa.core.disk_folder import list_files
from mlxpa.core.kv_cache_groups import KVCacheGroupSpec, KVCacheLayout
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.kv_disk import disk_prefix_end
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams

BS = 4
NB = 8  # bytes of a simulated block
FULL = KVCacheLayout(BS, (KVCacheGroupSpec(None, (0,)),), 1)
WINDOW = KVCacheLayout(BS, (KVCacheGroupSpec(None, (0,)), KVCacheGroupSpec(6, (1,))), 1)


@dataclass(eq=False)
class SaltedRequest(Request):
    cache_salt: str | None = None


def content(tokens: list[int], position: int, group: int) -> bytes:
    """The bytes a computed block holds: a function of everything before it."""
    return (hash((tuple(tokens[:(position + 1) * BS]), group)) & (2**64 - 1)).to_bytes(NB,
                                                                                        "little")


class Sim:
    """A manager over a pool whose blocks' bytes live in a dict; the runner's part of a step
    (saves read before anything is written, loads, then the computed blocks) simulated."""

    def __init__(self, root, layout=FULL, num_blocks=40, namespace="m",
                 segment_blocks=None) -> None:
        self.layout = layout
        self.kv = KVCacheManager(BlockPool(num_blocks, BS, segment_blocks, segment_blocks),
                                 True, layout)
        self.store = DiskStore(root, namespace_key({"m": namespace}), {}, 1 << 30, NB,
                               len(layout.groups), background=False)
        assert self.kv.attach_disk(self.store)
        self.bytes: dict[int, bytes] = {}
        self.saved = self.loaded = 0

    def apply_disk_ops(self) -> None:
        saves, loads = self.kv.take_disk_ops()
        for save in saves:
            self.store.put(save.header, b"".join(self.bytes[b] for b in save.blocks))
            self.saved += 1
        for load in loads:
            for i, b in enumerate(load.blocks):
                self.bytes[b] = load.payload[i * NB:(i + 1) * NB]
            self.loaded += len(load.blocks)

    def run(self, tokens: list[int], salt: str | None = None) -> int:
        """One request through admission, one prefill step and free; returns its hit."""
        req = SaltedRequest("r", list(tokens), SamplingParams(max_tokens=1), cache_salt=salt)
        hit = self.kv.get_computed_blocks(req)
        n = len(tokens) - hit.num_tokens
        assert self.kv.allocate_slots(req, n, hit) is not None
        self.apply_disk_ops()
        req.num_computed_tokens = hit.num_tokens
        for g, table in enumerate(req.block_tables):  # what the hit holds is exact
            for p, b in enumerate(table[:hit.num_tokens // BS]):
                if b != NULL_BLOCK:
                    assert self.bytes[b] == content(tokens, p, g), (g, p)
            for p in range(hit.num_tokens // BS, len(table)):  # the forward writes the rest
                self.bytes[table[p]] = content(tokens, p, g)
        req.num_computed_tokens = len(tokens)
        self.kv.cache_blocks(req)
        self.kv.free(req)
        self.kv.check_invariants([])
        return hit.num_tokens

    def write_back(self) -> None:
        for save in self.kv.disk.write_back():
            self.store.put(save.header, b"".join(self.bytes[b] for b in save.blocks))
            self.saved += 1


SHARED = list(range(100, 120))  # 5 blocks
A, B, C = SHARED + [1, 2, 3], SHARED + [4, 5, 6], SHARED + [7, 8, 9, 10]


def test_only_hit_blocks_are_written_and_a_new_process_reads_them(tmp_path):
    sim = Sim(tmp_path)
    assert sim.run(A) == 0
    sim.write_back()
    assert sim.saved == 0  # a unique prompt is not worth keeping
    assert sim.run(B) == 20
    sim.write_back()
    assert sim.saved == 5  # the shared prefix's blocks, not A's or B's own
    fresh = Sim(tmp_path)
    assert fresh.run(C) == 20 and fresh.loaded == 5  # from disk, bytes checked in run()
    assert fresh.kv.disk.take_hit_tokens() == 20
    assert fresh.run(A) == 20 and fresh.loaded == 5  # then from memory


def test_evicted_hit_blocks_are_saved_before_their_reuse(tmp_path):
    sim = Sim(tmp_path, num_blocks=10)  # 9 blocks: the next prompts evict the shared ones
    sim.run(A)
    sim.run(B)
    sim.run(list(range(300, 332)))  # 8 blocks: 4 of the shared 5 evicted, saved first
    assert sim.saved == 4
    assert sim.run(C) == 20 and sim.loaded == 4  # block 0 from memory, 1..4 from disk
    sim.run(list(range(400, 436)))  # 9 blocks: the shared ones evicted again, not saved
    assert sim.saved == 5  # block 0 now; the others were on disk already
    assert Sim(tmp_path).run(C) == 20


def test_salts_never_share_blocks_on_disk(tmp_path):
    """A lookup roots its chain at the request's ``cache_salt``: blocks written without a
    salt are not found by any salt. (Blocks of salted requests are written once the tree
    keeps salts apart: the tree's root carries the salt the keys start from.)"""
    sim = Sim(tmp_path)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    for salt in ("", "bob"):
        assert Sim(tmp_path).run(C, salt=salt) == 0
    assert Sim(tmp_path).run(C) == 20


def test_another_model_namespace_misses(tmp_path):
    sim = Sim(tmp_path)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    assert Sim(tmp_path, namespace="another").run(C) == 0


def test_sliding_window_blocks_are_kept_where_hits_end(tmp_path):
    """Window 6, blocks of 4: a hit of 5 blocks needs the window group's blocks 3 and 4;
    the file of position 0..2 holds its full-attention block only."""
    sim = Sim(tmp_path, WINDOW)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    fresh = Sim(tmp_path, WINDOW)
    assert fresh.run(C) == 20
    assert fresh.loaded == 5 + 2


def test_a_file_missing_its_window_blocks_serves_only_a_usable_hit(tmp_path):
    sim = Sim(tmp_path, WINDOW)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    # the window blocks of positions 3 and 4 gone from disk: the hit at 20 is unusable, and
    # so is any hit beyond position 0 (each needs a window block after position 0)
    fresh = Sim(tmp_path, WINDOW)
    for p in (3, 4):
        key = fresh.kv.disk._keys(SaltedRequest("x", SHARED, SamplingParams()), SHARED)[p]
        h, parts = fresh.store.read(key, fresh.kv.disk._keys(
            SaltedRequest("x", SHARED, SamplingParams()), SHARED)[p - 1], p, SHARED[p * 4:
                                                                                    p * 4 + 4])
        fresh.store.put(h._replace(groups=(True, False)), bytes(parts[0]))
    fresh.store.take_stats()
    assert fresh.run(C) == 0
    assert fresh.store.take_stats().blocks_read == 0  # no usable end: no file read


def test_no_room_in_the_pool_reads_nothing(tmp_path):
    sim = Sim(tmp_path)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    tiny = Sim(tmp_path, num_blocks=7)  # 6 blocks, one of them held by a running request
    other = SaltedRequest("o", list(range(300, 304)), SamplingParams(max_tokens=1))
    assert tiny.kv.allocate_slots(other, 4) is not None
    req = SaltedRequest("c", C, SamplingParams(max_tokens=1))
    assert tiny.kv.get_computed_blocks(req).num_tokens == 0  # 5 to read + 1 > 5 free
    assert tiny.kv.take_disk_ops() == ([], [])
    tiny.kv.free(other)
    assert tiny.kv.get_computed_blocks(req).num_tokens == 20


def test_a_pool_below_its_ceiling_grows_for_a_disk_hit(tmp_path):
    """A server's pool holds one segment at start and after a release: a hit on disk larger
    than the segment grows the pool (as a computed prompt does), and the hit is the one a
    pool preallocated at the ceiling gets."""
    sim = Sim(tmp_path)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    small = Sim(tmp_path, num_blocks=40, segment_blocks=4)  # 3 usable blocks now
    assert small.kv.pool.num_blocks == 4
    assert small.run(C) == 20 and small.loaded == 5
    assert small.kv.pool.num_blocks > 4
    assert small.store.take_stats().blocks_read == 5


def test_reading_stops_when_computing_is_faster(tmp_path):
    sim = Sim(tmp_path)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    fresh = Sim(tmp_path)
    fresh.kv.disk.read_ms_per_block, fresh.kv.disk.recompute_ms_per_block = 2.0, 1.0
    assert fresh.run(C) == 0
    fresh.kv.disk.recompute_ms_per_block = 3.0
    assert fresh.run(C) == 20


# ---------------------------------------------------------------------- recurrent snapshots

SNAP = 12  # bytes of a simulated snapshot's state (in 2 blocks of NB: 4 bytes of padding)
HYBRID = KVCacheLayout(BS, (KVCacheGroupSpec(None, (0,)),), 1, recurrent=(1,),
                       snapshot_blocks=2)


def state(tokens: list[int], position: int) -> bytes:
    """The recurrent state after ``tokens[:position]``, padded to its 2 blocks."""
    h = hash(("state", tuple(tokens[:position]))) & (2**64 - 1)
    return (h.to_bytes(8, "little") + bytes([position % 256]) * 4) + bytes(2 * NB - SNAP)


class RecurrentSim(Sim):
    """A hybrid model's manager: snapshot points, the states a step saves and restores (their
    bytes checked like the blocks')."""

    def __init__(self, root, num_blocks=40) -> None:
        self.layout = HYBRID
        self.kv = KVCacheManager(BlockPool(num_blocks, BS), True, HYBRID)
        self.store = DiskStore(root, namespace_key({"m": "hybrid"}), {}, 1 << 30, NB, 1,
                               background=False, snapshot_nbytes=SNAP)
        assert self.kv.attach_disk(self.store)
        self.bytes = {}
        self.saved = self.loaded = 0

    def run(self, tokens: list[int], points=()) -> int:
        """One request, computed in chunks that end at its snapshot points; returns its
        hit."""
        req = SaltedRequest("r", list(tokens), SamplingParams(max_tokens=1))
        hit = self.kv.get_computed_blocks(req)
        for p in points:
            self.kv.add_snapshot_point(req, p)
        start, computed = hit.num_tokens, hit
        while start < len(tokens):
            n = min(len(tokens) - start, self.kv.chunk_limit(req, start) or len(tokens))
            assert self.kv.allocate_slots(req, n, computed) is not None
            self.apply_disk_ops()
            saves, restores = self.kv.take_state_ops()
            for _, blocks in restores:  # the state resumed from is exact
                assert b"".join(self.bytes[b] for b in blocks) == state(tokens, start)
            if computed is not None:
                for p, b in enumerate(req.block_tables[0][:start // BS]):
                    assert self.bytes[b] == content(tokens, p, 0), p
                computed = None
            for p in range(start // BS, len(req.block_tables[0])):
                self.bytes[req.block_tables[0][p]] = content(tokens, p, 0)
            for _, blocks in saves:
                data = state(tokens, start + n)
                for i, b in enumerate(blocks):
                    self.bytes[b] = data[i * NB:(i + 1) * NB]
            req.num_computed_tokens = start = start + n
            self.kv.cache_blocks(req)
        self.kv.free(req)
        self.kv.check_invariants([])
        return hit.num_tokens


def test_a_snapshot_goes_to_disk_with_its_position_and_a_new_process_resumes_there(tmp_path):
    sim = RecurrentSim(tmp_path)
    assert sim.run(A, points=[20]) == 0
    assert sim.run(B) == 20  # from the tree's snapshot
    sim.write_back()
    stats = sim.store.take_stats()
    assert (sim.saved, stats.blocks_written, stats.snapshots_written) == (5, 5, 1)
    assert stats.bytes_written == sum(f.nbytes for f in list_files(tmp_path))
    fresh = RecurrentSim(tmp_path)
    assert fresh.run(C) == 20 and fresh.loaded == 5 + 2  # the blocks, the snapshot's 2
    assert fresh.store.take_stats().snapshots_read == 1
    assert fresh.kv.disk.take_hit_tokens() == 20


def test_an_evicted_snapshot_is_saved_before_its_reuse(tmp_path):
    sim = RecurrentSim(tmp_path, num_blocks=10)  # 9 blocks
    sim.run(A, points=[20])
    sim.run(B)
    sim.run(list(range(300, 332)))  # 8 blocks: the snapshot and shared blocks 1..4 evicted
    assert sim.saved == 4 and sim.kv.tree.num_cached_blocks(C) == 1
    assert sim.run(C) == 20 and sim.loaded == 4 + 2  # block 0 from the tree, 1..4 from disk


def test_a_snapshot_dropped_alone_is_read_back_for_the_blocks_in_memory(tmp_path):
    """The tree drops the idle snapshot, keeps the blocks: the snapshot is saved with its
    position, and the next hit reads it back alone (its tokens count as memory hits)."""
    sim = RecurrentSim(tmp_path)
    sim.run(A, points=[20])
    assert sim.run(B) == 20
    assert sim.kv.tree.evict(1) == 2  # the snapshot's 2 blocks, the oldest idle ones
    sim.apply_disk_ops()  # the save, read before the blocks are used again
    assert sim.saved == 1 and sim.kv.tree.num_cached_blocks(C) == 5
    assert sim.kv.tree.match_prefix(C).num_tokens == 0  # no snapshot in memory
    assert sim.run(C) == 20 and sim.loaded == 2
    assert sim.kv.disk.take_hit_tokens() == 0


def test_a_disk_hit_ends_only_at_a_snapshot(tmp_path):
    """Snapshots after blocks 3 and 5; the file of block 5 rewritten without its snapshot:
    a new process's hit ends after block 3, the deepest snapshot on disk."""
    sim = RecurrentSim(tmp_path)
    sim.run(A, points=[12, 20])
    assert sim.run(B) == 20
    sim.write_back()
    assert sim.store.take_stats().snapshots_written == 2
    fresh = RecurrentSim(tmp_path)
    keys = fresh.kv.disk._keys(SaltedRequest("x", SHARED, SamplingParams()), SHARED)
    h, parts = fresh.store.read(keys[4], keys[3], 4, SHARED[16:20])
    assert h.snapshot and len(parts[1]) == SNAP
    assert disk_prefix_end(fresh.store, HYBRID, C[:-1]) == 5  # mlxpa plan's count
    fresh.store.put(h._replace(snapshot=False), bytes(parts[0]))
    assert disk_prefix_end(fresh.store, HYBRID, C[:-1]) == 3
    assert disk_prefix_end(fresh.store, HYBRID, C[:-1], start=3) == 3
    fresh.store.take_stats()
    assert fresh.run(C) == 12 and fresh.loaded == 3 + 2
    assert fresh.store.take_stats().blocks_read == 3  # the files the hit needs, no more


def test_files_without_a_usable_end_are_never_read(tmp_path):
    """Files of every position but no snapshot on disk (a hybrid model's, the snapshot's
    file rewritten without it): their headers show no usable end, so a lookup (repeated
    each step while a request waits) reads and verifies none of them."""
    sim = RecurrentSim(tmp_path)
    sim.run(A, points=[20])
    assert sim.run(B) == 20
    sim.write_back()
    fresh = RecurrentSim(tmp_path)
    keys = fresh.kv.disk._keys(SaltedRequest("x", SHARED, SamplingParams()), SHARED)
    h, parts = fresh.store.read(keys[4], keys[3], 4, SHARED[16:20])
    fresh.store.put(h._replace(snapshot=False), bytes(parts[0]))
    fresh.store.take_stats()
    req = SaltedRequest("c", C, SamplingParams(max_tokens=1))
    for _ in range(3):
        assert fresh.kv.get_computed_blocks(req).num_tokens == 0
    assert fresh.kv.take_disk_ops() == ([], [])
    stats = fresh.store.take_stats()
    assert (stats.blocks_read, stats.bytes_read, stats.invalid_files) == (0, 0, 0)
    assert fresh.kv.disk.read_ms_per_block is None


def test_a_bad_file_ends_the_hit_at_the_usable_end_before_it(tmp_path):
    """Snapshots after blocks 3 and 5; the file of block 4 damaged (its header intact): the
    deepest end's reads stop at it, it is removed, and the hit ends after block 3 (its files
    already read, not read again)."""
    sim = RecurrentSim(tmp_path)
    sim.run(A, points=[12, 20])
    assert sim.run(B) == 20
    sim.write_back()
    fresh = RecurrentSim(tmp_path)
    keys = fresh.kv.disk._keys(SaltedRequest("x", SHARED, SamplingParams()), SHARED)
    path = fresh.store.path(keys[3])
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert disk_prefix_end(fresh.store, HYBRID, C[:-1]) == 5  # the header still names it
    assert fresh.run(C) == 12 and fresh.loaded == 3 + 2
    stats = fresh.store.take_stats()
    assert (stats.blocks_read, stats.invalid_files, stats.snapshots_read) == (3, 1, 1)
    assert not fresh.store.contains(keys[3])


def test_plan_counts_the_consecutive_usable_files(tmp_path):
    """:func:`disk_prefix_end` (``mlxpa plan``) continues the chain from a memory hit over
    the files, to the end a lookup would use: none under another salt, none past a file
    missing its window blocks."""
    sim = Sim(tmp_path, WINDOW)
    sim.run(A)
    sim.run(B)
    sim.write_back()
    assert disk_prefix_end(sim.store, WINDOW, C[:-1]) == 5
    assert disk_prefix_end(sim.store, WINDOW, C[:-1], start=2) == 5
    assert disk_prefix_end(sim.store, WINDOW, C[:-1], cache_salt="") == 0
    # a hit of 2 blocks needs the window blocks of 0 and 1, which the files do not keep
    assert disk_prefix_end(sim.store, WINDOW, C[:9]) == 0
    keys = sim.kv.disk._keys(SaltedRequest("x", SHARED, SamplingParams()), SHARED)
    h, parts = sim.store.read(keys[4], keys[3], 4, SHARED[16:20])
    sim.store.put(h._replace(groups=(True, False)), bytes(parts[0]))
    assert disk_prefix_end(sim.store, WINDOW, C[:-1]) == 0  # as a lookup: 0 (above)
    full = Sim(tmp_path / "full")
    full.run(A)
    full.run(B)
    full.write_back()
    assert disk_prefix_end(full.store, FULL, C[:-1]) == 5
    assert disk_prefix_end(full.store, FULL, C[:9]) == 2  # whole blocks of the tokens
