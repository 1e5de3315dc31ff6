"""Parquet results that survive a crash: finished row groups on disk, one file at the end.

While a run writes ``out.parquet``, each finished row group (``row_group_size`` records, never
splitting one input row's ``n`` samples) becomes a complete Parquet file in a hidden
``.out.parquet.parts/`` folder beside the target (written as ``*.tmp``, then renamed), so a crash,
even SIGKILL, leaves every finished group readable. :meth:`ParquetSink.close` merges the kept
previous file (``--resume``) and the parts into a temporary file in the same folder, one row
group at a time (in input order on an ordered ``--resume``: :mod:`mlxpa.data.order`), renames
it over the target and removes the parts folder.

The schema is stable whatever the records hold: the core columns of :mod:`mlxpa.data.schema`
first, then extra keys in the order first seen. ``id`` is ``int64`` until a string id appears
(then ``string``); an int column that meets floats becomes ``float64``; values that cannot share
an Arrow type are stored as JSON text; ``logprobs`` and ``prompt_logprobs`` have one nested type
(:func:`token_logprobs_type`). Each part has its own schema; the merge widens them to one.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mlxpa.data._files import atomic_rewrite
from mlxpa.data.order import parquet_in_order
from mlxpa.data.schema import CORE_TYPES, TOKEN_LOGPROB_COLUMNS
from mlxpa.utils import json_default


def parts_dir(path: str) -> str:
    """The hidden folder of finished row groups of the Parquet output ``path``."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.parts")


def _part_files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(parts_dir(path), "part-*.parquet")))


class ParquetSink:
    """Parquet output for :class:`~mlxpa.data.write.ResultWriter` (see the module docstring).

    Args:
        path: The target ``.parquet`` path.
        row_group_size: Records per row group (a row's samples are never split, so a group
            may hold up to ``n - 1`` more). A group is also written once its first record is
            ``flush_interval_s`` old, so a crash loses at most that much finished work.
        flush_interval_s: Seconds a finished record may wait in memory.
        resume: Keep the existing target and parts; the merge puts them first.
    """

    def __init__(self, path: str, row_group_size: int, resume: bool = False,
                 flush_interval_s: float = 30.0) -> None:
        import pyarrow as pa

        self._pa = pa
        self._path = path
        self._dir = os.path.dirname(os.path.abspath(path))
        self._parts = parts_dir(path)
        self._row_group_size = max(1, row_group_size)
        self._buffer: list[dict] = []
        self._flush_interval_s = flush_interval_s
        self._buffered_at = 0.0
        for stale in glob.glob(os.path.join(self._dir, f".{os.path.basename(path)}.*.tmp")):
            os.remove(stale)  # an interrupted merge
        if os.path.isdir(self._parts) and (not resume or _merged_already(path)):
            shutil.rmtree(self._parts)
        os.makedirs(self._parts, exist_ok=True)
        for stale in glob.glob(os.path.join(self._parts, "*.tmp")):
            os.remove(stale)  # a part torn by a crash
        self._base = path if resume and os.path.isfile(path) else None
        self._num_parts = self._num_old_parts = len(_part_files(path))

    def write(self, groups: list[list[dict]]) -> None:
        for records in groups:
            if records and not self._buffer:
                self._buffered_at = time.monotonic()
            self._buffer.extend(records)
            if (len(self._buffer) >= self._row_group_size or self._buffer and
                    time.monotonic() - self._buffered_at >= self._flush_interval_s):
                self._flush()

    def close(self, merge: bool = True, positions: Mapping[str, int] | None = None,
              new_index: Sequence[int] = ()) -> None:
        """Write the buffered group; then (``merge``) build the target and drop the parts.

        With ``positions`` (an ordered ``--resume``: the input index of each id an earlier
        run wrote) and ``new_index`` (the input index of each record written through this
        sink), the target holds the records in input order
        (:func:`~mlxpa.data.order.parquet_in_order`); else in the order they were written.
        """
        self._flush()
        if not merge:
            if self._base is None and not _part_files(self._path):
                with contextlib.suppress(OSError):  # stopped before any row: no output at all
                    os.rmdir(self._parts)
            return
        pa = self._pa
        import pyarrow.parquet as pq

        sources = ([self._base] if self._base else []) + _part_files(self._path)
        types = _core_types(pa)
        for src in sources:
            for field in pq.read_schema(src):
                types[field.name] = _merge_type(pa, types.get(field.name, pa.null()),
                                                field.type)
        schema = _resolved_schema(pa, types)

        def load(source: int, group: int) -> Any:
            table = pq.ParquetFile(sources[source]).read_row_group(group)
            return table if table.schema.equals(schema) else _to_table(
                pa, table.to_pylist(), schema)

        tables = None if positions is None else parquet_in_order(
            sources, (self._base is not None) + self._num_old_parts, positions, new_index,
            load, self._row_group_size)
        if tables is None:
            tables = (load(s, i) for s in range(len(sources))
                      for i in range(pq.ParquetFile(sources[s]).num_row_groups))
        with atomic_rewrite(self._path) as tmp, pq.ParquetWriter(tmp, schema) as writer:
            for table in tables:
                writer.write_table(table)
            if not sources:
                writer.write_table(schema.empty_table())
        # NOTE: a crash right here leaves parts that the new target already holds; the
        # target is newer than all of them, which is how _merged_already tells.
        shutil.rmtree(self._parts, ignore_errors=True)

    def _flush(self) -> None:
        if not self._buffer:
            return
        pa = self._pa
        import pyarrow.parquet as pq

        types = _core_types(pa)
        for key in dict.fromkeys(k for r in self._buffer for k in r):
            new = (token_logprobs_type(pa) if key in TOKEN_LOGPROB_COLUMNS
                   else _infer_type(pa, [r.get(key) for r in self._buffer]))
            types[key] = _merge_type(pa, types.get(key, pa.null()), new)
        schema = _resolved_schema(pa, types)
        final = os.path.join(self._parts, f"part-{self._num_parts:06d}.parquet")
        pq.write_table(_to_table(pa, self._buffer, schema), final + ".tmp")
        os.replace(final + ".tmp", final)
        self._num_parts += 1
        self._buffer = []


def _merged_already(path: str) -> bool:
    """True when ``path`` was written after every part (a merge finished, its cleanup not)."""
    parts = _part_files(path)
    return bool(parts) and os.path.isfile(path) and os.path.getmtime(path) >= max(
        os.path.getmtime(p) for p in parts)


def iter_parquet_ids(path: str) -> Iterator[Any]:
    """Every ``id`` already in a Parquet output: the target file (if complete) and the
    finished parts of an interrupted run (what ``--resume`` keeps).

    Raises:
        OSError: The target exists but is not a readable Parquet file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [] if _merged_already(path) else _part_files(path)
    for src in ([path] if os.path.isfile(path) else []) + parts:
        try:
            pf = pq.ParquetFile(src)
        except pa.ArrowException as e:
            raise OSError(f"{src}: not a readable Parquet file ({e})") from None
        if "id" not in pf.schema_arrow.names:
            raise OSError(f'{src}: no "id" column')
        for i in range(pf.num_row_groups):
            yield from pf.read_row_group(i, columns=["id"]).column("id").to_pylist()


def _core_types(pa: Any) -> dict[str, Any]:
    # The core columns start at their stable types, id undecided (null until a value comes).
    arrow = {None: pa.null(), str: pa.string(), int: pa.int64()}
    return {name: arrow[kind] for name, kind in CORE_TYPES.items()}


def _resolved_schema(pa: Any, types: dict[str, Any]) -> Any:
    return pa.schema([(k, pa.int64() if k == "id" and pa.types.is_null(t) else t)
                      for k, t in types.items()])


def token_logprobs_type(pa: Any) -> Any:
    """The Arrow type of a ``logprobs`` / ``prompt_logprobs`` column: ``list<struct<token:
    string, logprob: double, top_logprobs: list<struct<token: string, logprob: double>>>>``."""
    pair = [pa.field("token", pa.string()), pa.field("logprob", pa.float64())]
    return pa.list_(pa.struct([*pair, pa.field("top_logprobs", pa.list_(pa.struct(pair)))]))


def _infer_type(pa: Any, values: list) -> Any:
    try:
        t = pa.array(values).type
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.string()  # values that cannot share a type: stored JSON-encoded
    return t if _storable(pa, t) else pa.string()


def _storable(pa: Any, t: Any) -> bool:
    """Whether Parquet can store type ``t`` (not a struct without fields, such as a kept
    ``{}``, at any depth)."""
    if pa.types.is_struct(t):
        return t.num_fields > 0 and all(_storable(pa, t.field(i).type)
                                        for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _storable(pa, t.value_type)
    return True


def _merge_type(pa: Any, old: Any, new: Any) -> Any:
    if old.equals(new) or pa.types.is_null(new):
        return old
    if pa.types.is_null(old):
        return new
    numeric = (pa.types.is_integer(old) or pa.types.is_floating(old)) and (
        pa.types.is_integer(new) or pa.types.is_floating(new))
    return pa.float64() if numeric else pa.string()


def _to_table(pa: Any, records: list[dict], schema: Any) -> Any:
    arrays = []
    for f in schema:
        values = [r.get(f.name) for r in records]
        if pa.types.is_string(f.type):
            values = [v if v is None or isinstance(v, str)
                      else json.dumps(v, ensure_ascii=False, default=json_default)
                      for v in values]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
