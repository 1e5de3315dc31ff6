"""Tests for mlxpa.core.disk_cache: the hash chain (salts never meet), files written whole and
read back exactly, and every doubtful file skipped and removed: truncated, bit-flipped,
another namespace's, another block size's, half-written (a temporary name), written by two
processes at once; a folder that refuses writes warns once; the bound removes the least
recently used files; listing and clearing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from mlxpa.core import disk_cache
from mlxpa.core.disk_cache import (
    BlockHeader,
    DiskStore,
    chain_keys,
    chain_next,
    chain_root,
    namespace_key,
)
from mlxpa.core.disk_folder import clear_folder, list_files, summarize_folder

NB = 64  # bytes of a block
TOKENS = list(range(10, 26))  # two blocks of 8


def store(root, namespace="ns0", block_nbytes=NB, groups=2, max_bytes=1 << 30, warn=None):
    return DiskStore(root, namespace_key({"n": namespace}), {"model": {"name": namespace}},
                     max_bytes, block_nbytes, groups, background=False, warn=warn)


def header(s: DiskStore, position: int = 0, salt=None, groups=(True, True)) -> BlockHeader:
    keys = chain_keys(chain_root(s.namespace, salt), TOKENS, 8)
    parent = keys[position - 1] if position else chain_root(s.namespace, salt)
    return BlockHeader(keys[position], parent, position,
                       tuple(TOKENS[position * 8:(position + 1) * 8]), groups)


def payload(groups=(True, True), fill=7) -> bytes:
    return bytes([fill]) * (NB * sum(groups))


def read(s: DiskStore, h: BlockHeader):
    return s.read(h.key, h.parent, h.position, h.tokens)


def test_chain_keys_depend_on_everything_before():
    ns = namespace_key({"model": "a"})
    root = chain_root(ns)
    keys = chain_keys(root, TOKENS, 8)
    assert keys == [chain_next(root, TOKENS[:8]), chain_next(keys[0], TOKENS[8:])]
    assert chain_keys(root, TOKENS, 8, start=1) == keys[1:]
    assert chain_keys(root, TOKENS, 8, start=1, parent=keys[0]) == keys[1:]
    other = TOKENS[:7] + [99] + TOKENS[8:]  # block 0 differs: block 1's key too
    assert chain_keys(root, other, 8)[1] != keys[1]
    assert chain_keys(chain_root(namespace_key({"model": "b"})), TOKENS, 8) != keys


def test_a_salt_never_hits_another_salts_blocks():
    ns = namespace_key({"model": "a"})
    roots = [chain_root(ns, salt) for salt in (None, "", "alice", "bob")]
    assert len({chain_keys(r, TOKENS, 8)[0] for r in roots}) == 4
    assert chain_root(ns, "alice") == chain_root(ns, "alice")


def test_round_trip_and_absent_groups(tmp_path):
    s = store(tmp_path)
    h = header(s, 1, groups=(True, False))
    s.put(h, payload((True, False)))
    got = read(s, h)
    assert got is not None
    head, parts = got
    assert head == h and bytes(parts[0]) == payload((True, False)) and parts[1] is None
    assert s.contains(h.key) and not s.contains(header(s, 0).key)
    stats = s.take_stats()
    assert (stats.blocks_written, stats.blocks_read, stats.invalid_files) == (1, 1, 0)
    assert stats.bytes_read == stats.bytes_written == os.path.getsize(s.path(h.key))


def _corrupt(path: str, how: str) -> None:
    data = bytearray(open(path, "rb").read())
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "bit-flip-payload":
        data[-40] ^= 0x01
    elif how == "bit-flip-header":
        data[20] ^= 0x04
    elif how == "empty":
        data = bytearray()
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "bit-flip-payload", "bit-flip-header", "empty"])
def test_a_damaged_file_is_skipped_and_removed(tmp_path, how):
    s = store(tmp_path)
    h = header(s)
    s.put(h, payload())
    _corrupt(s.path(h.key), how)
    assert read(s, h) is None
    assert not os.path.exists(s.path(h.key))
    assert s.take_stats().invalid_files == 1


def test_a_foreign_file_is_never_read(tmp_path):
    """Another model's (namespace), another block size's, other tokens at the same key."""
    mine = store(tmp_path / "a")
    h = header(mine)
    for other in (store(tmp_path / "b", namespace="other"), store(tmp_path / "c", block_nbytes=32)):
        other.put(h, bytes(other.block_nbytes * 2))
        os.makedirs(os.path.dirname(mine.path(h.key)), exist_ok=True)
        os.replace(other.path(h.key), mine.path(h.key))
        assert read(mine, h) is None
    mine.put(h, payload())
    assert mine.read(h.key, h.parent, h.position, [0] * 8) is None  # the tokens differ
    assert mine.take_stats().invalid_files == 3


def test_the_files_on_disk_are_counted_as_they_are(tmp_path):
    """``num_files`` / ``num_bytes`` (the run report's files on disk, ``mlxpa:kv_disk_blocks``
    and ``_bytes``) follow the folder: a file written again is one file, an invalid file
    removed on reading is gone."""
    s = store(tmp_path)
    h0, h1 = header(s, 0), header(s, 1)
    s.put(h0, payload())
    s.put(h0, payload())  # another process's same block, or a file rewritten with more
    s.put(h1, payload())
    with open(s.path(h1.key), "rb") as f:
        data = bytearray(f.read())
    data[-1] ^= 1  # a bit flipped
    with open(s.path(h1.key), "wb") as f:
        f.write(data)
    assert read(s, h1) is None and s.take_stats().invalid_files == 1
    files = list_files(tmp_path)
    assert (s.num_files, s.num_bytes) == (len(files), sum(f.nbytes for f in files)) == (
        1, os.path.getsize(s.path(h0.key)))


def test_a_half_written_file_is_invisible(tmp_path):
    s = store(tmp_path)
    h = header(s)
    path = s.path(h.key)
    os.makedirs(os.path.dirname(path))
    with open(path + ".tmp-999-abcd", "wb") as f:
        f.write(disk_cache.MAGIC + b"\x10")  # a writer that died mid-file
    assert not s.contains(h.key) and read(s, h) is None
    assert [f.temporary for f in list_files(tmp_path)] == [True]


def test_a_folder_that_refuses_writes_warns_once(tmp_path, monkeypatch):
    warnings = []
    s = store(tmp_path, warn=warnings.append)

    def refuse(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache, "atomic_write", refuse)
    for position in (0, 1):
        s.put(header(s, position), payload())
    assert len(warnings) == 1 and "No space left" in warnings[0]
    assert not s.writable and s.take_stats().blocks_written == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_warns_once_and_still_reads(tmp_path):
    s = store(tmp_path)
    h = header(s)
    s.put(h, payload())
    for d, _, _ in os.walk(tmp_path):
        os.chmod(d, 0o555)
    try:
        warnings = []
        ro = store(tmp_path, warn=warnings.append)
        ro.put(header(ro, 1), payload())
        ro.put(header(ro, 1), payload())
        assert len(warnings) == 1 and read(ro, h) is not None
    finally:
        for d, _, _ in os.walk(tmp_path):
            os.chmod(d, 0o755)


def test_the_bound_removes_the_least_recently_used(tmp_path):
    s = store(tmp_path)
    size = None
    for position in (0, 1):
        h = header(s, position)
        s.put(h, payload())
        size = os.path.getsize(s.path(h.key))
        old = time.time() - 100 * (2 - position)
        os.utime(s.path(h.key), (old, old))
    read(s, header(s, 0))  # a read refreshes block 0: block 1 is now the oldest
    small = store(tmp_path, max_bytes=int(size * 2.5))
    small.put(header(small, 1, salt="x"), payload())  # a third file: over the bound
    assert small.contains(header(s, 0).key) and not small.contains(header(s, 1).key)
    assert small.take_stats().files_removed == 1
    assert small.num_files == 2


def test_the_bound_keeps_the_start_of_a_chain(tmp_path):
    """A prefix's files are written and read from block 0 on, and a hit needs every file
    from block 0: over the bound, the deepest files go first, never block 0 while a file
    after it stays (which no lookup could reach)."""
    tokens = list(range(10, 10 + 8 * 8))
    s = store(tmp_path)
    keys = chain_keys(chain_root(s.namespace), tokens, 8)
    headers = [BlockHeader(k, keys[p - 1] if p else chain_root(s.namespace), p,
                           tuple(tokens[p * 8:(p + 1) * 8]), (True, True))
               for p, k in enumerate(keys)]
    s.put(headers[0], payload())
    size = os.path.getsize(s.path(keys[0]))
    small = store(tmp_path, max_bytes=int(size * 5.5))
    for h in headers[1:]:
        small.put(h, payload())
    kept = [small.contains(k) for k in keys]
    assert kept == sorted(kept, reverse=True) and 3 <= sum(kept) <= 5, kept
    for h in headers[:sum(kept)]:  # reads keep it so
        assert read(small, h) is not None
    small.put(headers[sum(kept)], payload())
    kept = [small.contains(k) for k in keys]
    assert kept == sorted(kept, reverse=True) and kept[0], kept


WRITER = """
import sys
from tests.core.test_disk_cache import header, payload, store
s = store(sys.argv[1])
for round in range(20):
    for position in (0, 1):
        s.put(header(s, position), payload())
"""


def test_two_processes_writing_one_folder_leave_only_whole_files(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=env, cwd=root)
             for _ in range(2)]
    s = store(tmp_path)
    seen = 0
    while any(p.poll() is None for p in procs):
        for position in (0, 1):  # reads during the writes: whole files or none
            got = read(s, header(s, position))
            seen += got is not None
            assert got is None or bytes(got[1][0]) == payload()[:NB]
    assert all(p.wait() == 0 for p in procs)
    assert s.take_stats().invalid_files == 0
    assert all(read(s, header(s, p)) is not None for p in (0, 1))
    assert not any(f.temporary for f in list_files(tmp_path))


def test_summarize_and_clear(tmp_path):
    a, b = store(tmp_path, "model-a"), store(tmp_path, "model-b")
    a.put(header(a), payload())
    b.put(header(b, 0), payload())
    b.put(header(b, 1), payload())
    spaces = {s.model: s for s in summarize_folder(tmp_path)}
    assert (spaces["model-a"].num_files, spaces["model-b"].num_files) == (1, 2)
    assert clear_folder(tmp_path, b.namespace[:16])[0] == 2
    assert [s.model for s in summarize_folder(tmp_path)] == ["model-a"]
    assert clear_folder(tmp_path)[0] == 1 and summarize_folder(tmp_path) == []


def test_clear_touches_only_the_cache_folders_files(tmp_path):
    """``mlxpa cache clear``: a ``--namespace`` that is not one of the folder's namespaces
    (``..``, a path) is refused, and a folder pointed at by mistake loses no file, empty
    folder or ``namespace.json`` that the tier did not write."""
    root = tmp_path / "kv"
    s = store(root)
    s.put(header(s), payload())
    (tmp_path / "empty").mkdir()
    (tmp_path / "namespace.json").write_text("{}")
    (root / "notes" / "empty").mkdir(parents=True)
    (root / "notes" / "namespace.json").write_text("mine")
    (root / "notes" / "draft").mkdir()
    (root / "notes" / "draft" / "essay.txt.tmp-1").write_text("mine")
    for bad in ("..", "../kv", str(tmp_path), ".", "", "notes"):
        with pytest.raises(ValueError):
            clear_folder(root, bad)
    assert (tmp_path / "empty").is_dir() and (tmp_path / "namespace.json").exists()
    assert [s.model for s in summarize_folder(root)] == ["ns0"]
    (f,) = list_files(root)
    assert clear_folder(root) == (1, f.nbytes)
    assert (root / "notes" / "empty").is_dir()
    assert (root / "notes" / "namespace.json").read_text() == "mine"
    assert (root / "notes" / "draft" / "essay.txt.tmp-1").exists()
    assert summarize_folder(root) == [] and not os.path.exists(s.folder)


def test_a_snapshot_is_kept_without_its_padding_and_verified(tmp_path):
    """A position's file with the recurrent snapshot after it: the snapshot's state bytes
    only (its pool blocks' padding dropped), read back exactly; its header peeked without a
    read; a store whose snapshots differ in size, or a truncated file, never uses it."""
    s = DiskStore(tmp_path, namespace_key({"n": "h"}), {}, 1 << 30, NB, 2, background=False,
                  snapshot_nbytes=10)
    h = header(s)._replace(snapshot=True)
    state = bytes(range(10))
    s.put(h, payload() + state + bytes(2 * NB - 10))  # the snapshot's 2 pool blocks
    (f,) = list_files(tmp_path)
    assert s.peek(h.key, h.parent, h.position, h.tokens) == h
    head, parts = read(s, h)
    assert head == h and bytes(parts[0]) == bytes(parts[1]) == payload((True,))
    assert bytes(parts[2]) == state
    assert s.take_stats().snapshots_written == 1
    other = DiskStore(tmp_path, s.namespace, {}, 1 << 30, NB, 2, background=False,
                      snapshot_nbytes=12)
    assert other.peek(h.key, h.parent, h.position, h.tokens) is None
    assert read(other, h) is None and not os.path.exists(f.path)  # removed
    s.put(h, payload() + state)
    with open(f.path, "r+b") as fh:
        fh.truncate(f.nbytes - 1)
    assert read(s, h) is None and s.take_stats().invalid_files == 1
