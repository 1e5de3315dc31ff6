"""The disk tier's files: content-addressed KV blocks, written atomically, verified before use.

Pure Python (no mlx). One file per block position of a cached prefix (LMCache's and vLLM's
KV offloading's content-addressed chunks, SGLang HiCache's file backend, at mlxpa's block
granularity). A file's name is its *key*, a hash chain (vLLM's prefix-caching block hash)::

    root    = H(namespace, cache_salt)            namespace: model weights + config, tokenizer,
    key[0]  = H(root,     tokens of block 0)      adapter, KV dtype, block size, layout, ...
    key[i]  = H(key[i-1], tokens of block i)

so a key fixes everything the block's K/V depend on, and a folder serves later runs, a
restarted server and several processes at once. The file holds, per KV cache group, the
block's bytes at that position where it was kept (a sliding-window group's block may be a
tombstone already), as the pool stores them (:meth:`PagedKVCache.read_bytes`), and, for a
model with recurrent layers, the recurrent snapshot after the block's last token where one
was kept (its ``snapshot_nbytes`` bytes of state, without the padding of its pool blocks)::

    MAGIC (8) | header length (4, little-endian) | header (JSON) | payload (present groups'
    blocks, in group order, then the snapshot) | BLAKE2b-256 of everything before it (32)

The header repeats the key, its parent, the position, the tokens, the namespace, which groups
are present, whether a snapshot is, and the byte counts; a reader checks every one of them and
the digest, and a file that fails (truncated, bit-flipped, another model's, another format's)
is removed and counted, never used: the request computes those tokens instead. Files are
written to a temporary name in the same folder and renamed (``os.replace``), so a reader sees a
whole file or none; two processes writing one key write equal bytes. A write that fails for
lack of room or permission warns once and turns writing off (reads go on); the folder is kept
under its bound by removing the least recently used files (a read refreshes a file's
modification time), by whichever process finds it over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from mlxpa.core.disk_folder import (
    NAMESPACE_DIGITS,
    SUFFIX,
    atomic_write,
    list_files,
    remove_file,
)

FORMAT_VERSION = 1
MAGIC = b"MLXPAKV1"
_DIGEST = 32
_LEN = struct.Struct("<I")
# After a cleanup the folder holds at most this share of its bound (room for the next writes).
_LOW_WATER = 0.9
# A temporary file older than this (seconds) is a dead writer's and is removed by a cleanup.
_STALE_TMP_S = 3600.0
# A file's modification time is its last use, less this many seconds per block position: a
# prefix is written and read from block 0 on, and a hit needs every file from block 0, so of
# the files a write or a read used together the deepest go first over the bound, the first
# ones last (not block 0 while the files after it, that no lookup could reach, stay).
_DEPTH_S = 0.01

logger = logging.getLogger(__name__)


def namespace_key(identity: dict) -> str:
    """A hex digest of ``identity`` (JSON, keys sorted): what the chain's root hashes."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def chain_root(namespace: str, cache_salt: str | None = None) -> bytes:
    """The key before block 0 of a prompt: the namespace and the request's ``cache_salt``
    (None and ``""`` differ, so no hit crosses salts)."""
    salt = b"\x00" if cache_salt is None else b"\x01" + cache_salt.encode()
    return hashlib.blake2b(namespace.encode() + salt, digest_size=20).digest()


def chain_next(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a block: its parent's key and its tokens."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=20).digest()


def chain_keys(root: bytes, token_ids: Sequence[int], block_size: int,
               start: int = 0, parent: bytes | None = None) -> list[bytes]:
    """Keys of the full blocks ``start ..`` of ``token_ids`` (``parent``: block
    ``start - 1``'s key; None: hashed from the root)."""
    keys: list[bytes] = []
    h = root
    if start and parent is None:
        for i in range(start):
            h = chain_next(h, token_ids[i * block_size:(i + 1) * block_size])
    elif parent is not None:
        h = parent
    for i in range(start, len(token_ids) // block_size):
        h = chain_next(h, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(h)
    return keys


class BlockHeader(NamedTuple):
    """What a file says about its block.

    Attributes:
        key: The block's key; parent: its parent's key.
        position: The block's index in the prompt (block 0 first).
        tokens: The block's token ids.
        groups: Per KV cache group, whether the file holds its block.
        snapshot: Whether the file holds the recurrent snapshot after the block's last token.
    """

    key: bytes
    parent: bytes
    position: int
    tokens: tuple[int, ...]
    groups: tuple[bool, ...]
    snapshot: bool = False


@dataclass(slots=True)
class DiskStats:
    """The tier's counts since they were last taken (:meth:`DiskStore.take_stats`).

    Attributes:
        blocks_read, bytes_read: Block positions read back and verified, and their bytes.
        blocks_written, bytes_written: Block positions written (files), and their bytes.
        snapshots_read, snapshots_written: Of those, files holding a recurrent snapshot.
        invalid_files: Files skipped as invalid (and removed).
        files_removed: Files removed to keep the folder within its bound.
        read_s: Seconds spent reading and verifying.
    """

    blocks_read: int = 0
    bytes_read: int = 0
    blocks_written: int = 0
    bytes_written: int = 0
    snapshots_read: int = 0
    snapshots_written: int = 0
    invalid_files: int = 0
    files_removed: int = 0
    read_s: float = 0.0


@dataclass(slots=True)
class _Write:
    header: BlockHeader
    payload: bytes
    done: threading.Event | None = field(default=None)


class DiskStore:
    """The files of one namespace under ``root`` (``root/<namespace[:16]>/<key[:2]>/``).

    Args:
        root: The cache folder (``--kv-cache-dir``); created when missing.
        namespace: :func:`namespace_key` of the model and storage.
        identity: What the namespace hashes, written beside the files for ``mlxpa cache``.
        max_bytes: Most bytes of files the folder keeps (every namespace together).
        block_nbytes: Bytes of one block of the pool (every layer slot, K and V).
        num_groups: KV cache groups of the model.
        background: Write files on a thread (False: at once, for tests).
        warn: Called once with a message when writing stops working (default: log).
        snapshot_nbytes: Bytes of one recurrent snapshot's state (0: the model has none, no
            file holds one).
        read_only: Look only (``mlxpa plan``): nothing is created, written or removed under
            ``root`` (no folder, no ``namespace.json``, no invalid file removed).

    Raises:
        OSError: ``root`` cannot be created or read (the caller runs without the tier).
    """

    def __init__(self, root: str | os.PathLike[str], namespace: str, identity: dict,
                 max_bytes: int, block_nbytes: int, num_groups: int,
                 background: bool = True, warn: Callable[[str], None] | None = None,
                 snapshot_nbytes: int = 0, read_only: bool = False) -> None:
        self.root = os.fspath(root)
        self.namespace = namespace
        self.folder = os.path.join(self.root, namespace[:NAMESPACE_DIGITS])
        self.max_bytes = max_bytes
        self.block_nbytes = block_nbytes
        self.num_groups = num_groups
        self.snapshot_nbytes = snapshot_nbytes
        self.read_only = read_only
        self.writable = not read_only
        self._warn = warn or logger.warning
        self._lock = threading.Lock()
        self._stats = DiskStats()
        if not read_only:
            os.makedirs(self.folder, exist_ok=True)
            self._write_identity(identity)
        files = list_files(self.root)
        self._bytes = sum(f.nbytes for f in files)
        self._files = sum(not f.temporary for f in files)
        self._queue: queue.SimpleQueue[_Write | None] | None = None
        if background and not read_only:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._writer, name="mlxpa-kv-disk",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ paths

    def path(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.folder, h[:2], h + SUFFIX)

    def contains(self, key: bytes) -> bool:
        """Whether a file of ``key`` exists (not verified)."""
        return os.path.exists(self.path(key))

    def _write_identity(self, identity: dict) -> None:
        path = os.path.join(self.folder, "namespace.json")
        if os.path.exists(path):
            return
        try:
            atomic_write(path, json.dumps({"namespace": self.namespace, **identity},
                                           indent=1, sort_keys=True, default=str).encode())
        except OSError as e:
            self._stop_writing(e)

    # ------------------------------------------------------------------ reading

    def read(self, key: bytes, parent: bytes, position: int,
             tokens: Sequence[int]) -> tuple[BlockHeader, list[memoryview | None]] | None:
        """The block of ``key`` (whose parent, position and tokens the caller knows), verified:
        its header and, per group, its bytes, then the snapshot's ``snapshot_nbytes`` (None:
        not kept); None when there is no file or it fails a check (then it is removed and
        counted in ``invalid_files``)."""
        path = self.path(key)
        start = time.perf_counter()
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        parsed = self._parse(data, key, parent, position, tokens)
        if parsed is None:
            logger.debug("kv cache: skipped invalid file %s", path)
            removed = not self.read_only and remove_file(path)
            with self._lock:
                self._stats.invalid_files += 1
                if removed:
                    self._files = max(0, self._files - 1)
                    self._bytes = max(0, self._bytes - len(data))
            return None
        _touch(path, position)  # least recently used goes first
        with self._lock:
            s = self._stats
            s.blocks_read += 1
            s.snapshots_read += parsed[0].snapshot
            s.bytes_read += len(data)
            s.read_s += time.perf_counter() - start
        return parsed

    def _parse(self, data: bytes, key: bytes, parent: bytes, position: int,
               tokens: Sequence[int]) -> tuple[BlockHeader, list[memoryview | None]] | None:
        """The header and per-group bytes of a file's ``data``, or None if any check fails."""
        if len(data) < len(MAGIC) + _LEN.size + _DIGEST or not data.startswith(MAGIC):
            return None
        body, digest = data[:-_DIGEST], data[-_DIGEST:]
        if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
            return None
        (n,) = _LEN.unpack_from(body, len(MAGIC))
        at = len(MAGIC) + _LEN.size
        try:
            h = json.loads(body[at:at + n])
        except ValueError:
            return None
        header = self._check(h, key, parent, position, tokens)
        if header is None:
            return None
        payload = memoryview(body)[at + n:]
        if len(payload) != self._payload_nbytes(header):
            return None
        parts: list[memoryview | None] = []
        off = 0
        for present in header.groups:
            if present:
                parts.append(payload[off:off + self.block_nbytes])
                off += self.block_nbytes
            else:
                parts.append(None)
        parts.append(payload[off:] if header.snapshot else None)
        return header, parts

    def _check(self, h, key: bytes, parent: bytes, position: int,
               tokens: Sequence[int]) -> BlockHeader | None:
        """A file's header ``h`` (parsed JSON) as a :class:`BlockHeader` if it is this
        namespace's block of ``key`` at ``position`` after ``parent`` with ``tokens``."""
        if not isinstance(h, dict):
            return None
        groups, snapshot = h.get("groups"), h.get("snapshot", 0)
        if (h.get("version") != FORMAT_VERSION or h.get("namespace") != self.namespace
                or h.get("key") != key.hex() or h.get("parent") != parent.hex()
                or h.get("position") != position or h.get("tokens") != list(tokens)
                or h.get("block_nbytes") != self.block_nbytes
                or not isinstance(groups, list) or len(groups) != self.num_groups
                or snapshot not in (0, 1) or (snapshot and (
                    not self.snapshot_nbytes
                    or h.get("snapshot_nbytes") != self.snapshot_nbytes))):
            return None
        return BlockHeader(key, parent, position, tuple(tokens), tuple(map(bool, groups)),
                           bool(snapshot))

    def _payload_nbytes(self, header: BlockHeader) -> int:
        return (sum(header.groups) * self.block_nbytes
                + (self.snapshot_nbytes if header.snapshot else 0))

    def peek(self, key: bytes, parent: bytes, position: int,
             tokens: Sequence[int]) -> BlockHeader | None:
        """The header of ``key``'s file if it names this block (its payload and digest not
        read or verified: :meth:`read` does), else None; nothing is removed."""
        try:
            with open(self.path(key), "rb") as f:
                head = f.read(len(MAGIC) + _LEN.size)
                if len(head) < len(MAGIC) + _LEN.size or not head.startswith(MAGIC):
                    return None
                (n,) = _LEN.unpack_from(head, len(MAGIC))
                h = json.loads(f.read(n))
        except (OSError, ValueError):
            return None
        return self._check(h, key, parent, position, tokens)

    # ------------------------------------------------------------------ writing

    def put(self, header: BlockHeader, payload: bytes) -> None:
        """Write the block of ``header`` (``payload``: its present groups' bytes, in group
        order, then, with ``header.snapshot``, the snapshot's pool blocks, of which the first
        ``snapshot_nbytes`` are kept), in the background; nothing once writing failed."""
        if not self.writable:
            return
        n = self._payload_nbytes(header)
        assert len(payload) == n or header.snapshot and len(payload) > n, (header, len(payload))
        payload = memoryview(payload)[:n]
        if self._queue is None:
            self._write(_Write(header, payload))
        else:
            self._queue.put(_Write(header, payload))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write handed to :meth:`put` so far is done."""
        if self._queue is None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(_Write(BlockHeader(b"", b"", -1, (), ()), b"", done))
        done.wait(timeout_s)

    def close(self) -> None:
        """Finish the writes in flight and stop the writer thread."""
        self.flush()
        if self._queue is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5.0)

    def _writer(self) -> None:
        while (item := self._queue.get()) is not None:
            if item.done is not None:
                item.done.set()
                continue
            self._write(item)

    def _write(self, item: _Write) -> None:
        if not self.writable:
            return
        h = item.header
        header = json.dumps({
            "version": FORMAT_VERSION, "namespace": self.namespace, "key": h.key.hex(),
            "parent": h.parent.hex(), "position": h.position, "tokens": list(h.tokens),
            "groups": [int(g) for g in h.groups], "block_nbytes": self.block_nbytes,
            **({"snapshot": 1, "snapshot_nbytes": self.snapshot_nbytes} if h.snapshot else {}),
        }, separators=(",", ":")).encode()
        body = b"".join((MAGIC, _LEN.pack(len(header)), header, item.payload))
        data = body + hashlib.blake2b(body, digest_size=_DIGEST).digest()
        path = self.path(h.key)
        try:
            replaced = os.stat(path).st_size  # a file of the key (rewritten with more)
        except OSError:
            replaced = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, data)
        except OSError as e:
            self._stop_writing(e)
            return
        _touch(path, h.position)
        with self._lock:
            self._stats.blocks_written += 1
            self._stats.snapshots_written += h.snapshot
            self._stats.bytes_written += len(data)
            self._bytes += len(data) - (replaced or 0)
            self._files += replaced is None
            over = self._bytes > self.max_bytes
        if over:
            self.cleanup()

    def _stop_writing(self, error: OSError) -> None:
        if self.writable:
            self.writable = False
            self._warn(f"the KV disk cache stops writing: {error.strerror or error} "
                       f"({self.root}); the run goes on without saving KV blocks")

    # ------------------------------------------------------------------ bound

    def cleanup(self) -> int:
        """Remove the least recently used files of the folder (every namespace) until it
        holds at most 90% of ``max_bytes``, and dead writers' temporary files; returns the
        files removed (none when read-only)."""
        if self.read_only:
            return 0
        files = list_files(self.root)
        total = sum(f.nbytes for f in files)
        count = sum(not f.temporary for f in files)
        removed = 0
        now = time.time()
        for f in sorted(files, key=lambda f: f.mtime):
            stale = f.temporary and now - f.mtime > _STALE_TMP_S
            if not stale and (f.temporary or total <= _LOW_WATER * self.max_bytes):
                continue
            if remove_file(f.path):
                removed += 1
                total -= f.nbytes
                count -= not f.temporary
        with self._lock:
            self._bytes, self._files = total, count
            self._stats.files_removed += removed
        return removed

    @property
    def num_files(self) -> int:
        """Block files under the folder (every namespace; this process's count since its
        last scan)."""
        return self._files

    @property
    def num_bytes(self) -> int:
        """Bytes of those files."""
        return self._bytes

    def take_stats(self) -> DiskStats:
        """The counts since the last call (and reset them)."""
        with self._lock:
            stats, self._stats = self._stats, DiskStats()
        return stats


def _touch(path: str, position: int) -> None:
    """Mark ``path`` used now (its block at ``position``: see :data:`_DEPTH_S`)."""
    t = time.time() - position * _DEPTH_S
    try:
        os.utime(path, (t, t))
    except OSError:
        pass


__all__ = ["BlockHeader", "DiskStats", "DiskStore", "FORMAT_VERSION", "chain_keys",
           "chain_next", "chain_root", "namespace_key"]
