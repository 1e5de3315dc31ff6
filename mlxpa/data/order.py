"""Put a resumed output back in input order (``--resume`` without ``--unordered``).

A resumed run appends its rows after the rows an earlier run wrote, so at its end the records
are sorted (stably) by their input position: a record an earlier run wrote gets the index of
the first input row with its id (one whose id is no longer in the input goes last, in file
order); a record this run wrote gets the index it was added with (ids alone could not place a
duplicate id's error row).

The work is streamed: JSONL keeps one ``(position, byte offset)`` pair per line (16 bytes),
sorts them with numpy and copies byte ranges into a temporary file renamed over the output
(:func:`atomic_rewrite`), so each line keeps its bytes; Parquet assembles each output row group
from slices of the sources' row groups, holding at most :data:`CACHED_GROUPS` decoded groups.
An interrupt during the rewrite leaves the output complete and resumable; an output already in
order is not rewritten.
"""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from mlxpa.data._files import atomic_rewrite
from mlxpa.data.schema import id_key

END = np.iinfo(np.int64).max  # the position of a record that is not a done row of the input
CACHED_GROUPS = 16  # decoded Parquet row groups kept while assembling the output
COPY_CHUNK = 1 << 20  # bytes per read when copying a run of JSONL lines


def _line_key(raw: bytes) -> str | None:
    """The id key of one JSONL result line (``custom_id`` for an OpenAI Batch output line)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if "custom_id" in obj and "response" in obj:
        return id_key(obj["custom_id"])
    return id_key(obj["id"]) if "id" in obj else None


def jsonl_in_order(path: str, positions: Mapping[str, int], base_end: int,
                   new_index: Sequence[int]) -> bool:
    """Rewrite the JSONL output at ``path`` in input order (atomically, mode kept).

    Args:
        path: The output, complete (every line ends with a newline).
        positions: Id key to input index of each row an earlier run wrote.
        base_end: Byte offset where this run's lines start (the size the file had).
        new_index: The input index of each line this run wrote, in file order.

    Returns:
        Whether the file was rewritten (False: already in order, or the lines after
        ``base_end`` are not the ``len(new_index)`` this run wrote; then it is left as it is).

    Raises:
        OSError: The file cannot be read, or the rewrite cannot be written.
    """
    offsets, pos = array("q"), array("q")
    offset = num_new = 0
    with open(path, "rb") as f:
        for raw in f:
            offsets.append(offset)
            if offset < base_end:
                key = _line_key(raw)
                pos.append(positions.get(key, END) if key is not None else END)
            elif num_new < len(new_index):
                pos.append(new_index[num_new])
                num_new += 1
            else:
                return False
            offset += len(raw)
    if num_new != len(new_index):
        return False
    order = _sort_order(np.frombuffer(pos, dtype=np.int64))
    if order is None:
        return False
    starts = np.frombuffer(offsets, dtype=np.int64)
    ends = np.append(starts[1:], offset)
    with atomic_rewrite(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
        for start, stop in _byte_runs(starts[order], ends[order]):
            src.seek(start)
            while start < stop:
                data = src.read(min(COPY_CHUNK, stop - start))
                dst.write(data)
                start += len(data)
    return True


def _sort_order(pos: np.ndarray) -> np.ndarray | None:
    """The stable sorting permutation of ``pos``, or None when it is already sorted."""
    if len(pos) < 2 or bool(np.all(pos[1:] >= pos[:-1])):
        return None
    return np.argsort(pos, kind="stable")


def _byte_runs(starts: np.ndarray, ends: np.ndarray) -> Iterator[tuple[int, int]]:
    """The ``[start, end)`` byte ranges of lines in output order, adjacent ones joined."""
    breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    first = starts[np.concatenate(([0], breaks))]
    last = ends[np.concatenate((breaks - 1, [len(starts) - 1]))]
    for i in range(0, len(first), 1 << 16):  # a million runs never become Python ints at once
        yield from zip(first[i:i + (1 << 16)].tolist(), last[i:i + (1 << 16)].tolist())


def parquet_in_order(sources: Sequence[str], num_old: int, positions: Mapping[str, int],
                     new_index: Sequence[int], load: Callable[[int, int], Any],
                     row_group_size: int) -> Iterator[Any] | None:
    """The records of the Parquet ``sources`` in input order, as tables to write one by one.

    Args:
        sources: The kept output and the part files, in file order.
        num_old: How many of ``sources`` an earlier run wrote (their ids give positions);
            the rest hold the ``len(new_index)`` records this run wrote, in order.
        positions: Id key to input index of each row an earlier run wrote.
        new_index: The input index of each record this run wrote.
        load: ``load(source, row_group)``: that row group as a ``pyarrow.Table`` in the
            output schema.
        row_group_size: Records per output table (a row's samples are never split).

    Returns:
        An iterator of tables, or None when the records are already in order (or the new
        sources do not hold ``len(new_index)`` records): then merge them as they are.
    """
    import pyarrow.parquet as pq

    files = [pq.ParquetFile(src) for src in sources]
    sizes = [[f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]
             for f in files]
    if sum(map(sum, sizes[num_old:])) != len(new_index):
        return None
    pos = [_old_positions(f, positions) for f in files[:num_old]]
    pos.append(np.asarray(new_index, dtype=np.int64))
    order = _sort_order(np.concatenate(pos))
    if order is None:
        return None
    src = np.concatenate([np.full(sum(s), i, dtype=np.int32) for i, s in enumerate(sizes)])
    group = np.concatenate([np.repeat(np.arange(len(s), dtype=np.int32), s) for s in sizes])
    row = np.concatenate([np.arange(n, dtype=np.int64) for s in sizes for n in s])
    return _tables(np.concatenate(pos)[order], src[order], group[order], row[order], load,
                   row_group_size)


def _old_positions(f: Any, positions: Mapping[str, int]) -> np.ndarray:
    """The input position of each record of a file an earlier run wrote (by its id)."""
    out = array("q")
    for i in range(f.num_row_groups):
        for value in f.read_row_group(i, columns=["id"]).column("id").to_pylist():
            out.append(END if value is None else positions.get(id_key(value), END))
    return np.frombuffer(out, dtype=np.int64)


def _tables(pos: np.ndarray, src: np.ndarray, group: np.ndarray, row: np.ndarray,
            load: Callable[[int, int], Any], row_group_size: int) -> Iterator[Any]:
    """Output tables of about ``row_group_size`` records, cut where the position changes,
    each assembled from slices of the sources' row groups (an LRU cache of decoded ones)."""
    import pyarrow as pa

    cache: OrderedDict[tuple[int, int], Any] = OrderedDict()

    def group_table(key: tuple[int, int]) -> Any:
        if key in cache:
            cache.move_to_end(key)
        else:
            cache[key] = load(*key)
            if len(cache) > CACHED_GROUPS:
                cache.popitem(last=False)
        return cache[key]

    n, start = len(pos), 0
    while start < n:
        stop = min(start + row_group_size, n)
        while stop < n and pos[stop] == pos[stop - 1]:
            stop += 1
        s, g, r = src[start:stop], group[start:stop], row[start:stop]
        breaks = np.flatnonzero((s[1:] != s[:-1]) | (g[1:] != g[:-1]) | (r[1:] != r[:-1] + 1))
        firsts = np.concatenate(([0], breaks + 1)).tolist()
        lasts = np.concatenate((breaks, [len(s) - 1])).tolist()
        yield pa.concat_tables([group_table((int(s[a]), int(g[a]))).slice(int(r[a]), b - a + 1)
                                for a, b in zip(firsts, lasts)])
        start = stop
