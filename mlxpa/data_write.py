"""Result writers: JSONL (a file or stdout) and Parquet, in input order via a reorder buffer.

Records are added as rows finish, keyed by ``Row.index``. In ordered mode (the default) a record
waits in the reorder buffer until every earlier index is done, then it and every contiguous
successor are released at once: JSONL writes them and flushes, so finished results are on disk
(or down the pipe) as soon as order allows and nothing is held back to the end.

Parquet is written to a hidden temporary file next to the target and renamed over it in
:meth:`ResultWriter.close`, so the target is either the old file or a complete new one.
Released records are grouped into row groups of ``row_group_size``.

Parquet schema, stable whatever the records hold: ``id``, ``text``, ``finish_reason``,
``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``error`` always come first (text
columns ``string``, token counts ``int64``, missing values null), then any extra keys in the
order first seen. ``id`` is ``int64`` while every id is an int and becomes ``string`` (ints
written as ``"7"``) once a string id appears. A later record that widens a column (a string
id after int ones, int then float, a new key) makes the writer rewrite the rows already in the
temporary file under the wider schema, one row group at a time; a column whose values cannot
share an Arrow type is stored as ``string`` with non-strings JSON-encoded. Types never make
``add`` fail.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from mlxpa.data_read import PARQUET_EXTENSIONS, STDIN

CORE_COLUMNS = ("id", "text", "finish_reason", "prompt_tokens", "completion_tokens",
                "cached_tokens", "error")


class ResultWriter:
    """Write result records in input order to JSONL (file or stdout) or Parquet.

    ``add(index, record)`` takes the record for input row ``index``; a sequence of records
    (one per sample when n > 1) is also accepted and written consecutively. Use as a context
    manager: ``close`` runs on exit, also after an exception, so finished rows are kept.

    Args:
        path: Output path, or ``"-"`` for stdout (JSONL only; nothing else may write there).
        fmt: ``"jsonl"`` or ``"parquet"``; None picks Parquet for ``.parquet``/``.pq`` and
            JSONL otherwise.
        ordered: Write in input order (reorder buffer); False writes records as they come.
        row_group_size: Parquet records per row group (bounds the writer's memory).

    Raises:
        ValueError: Unknown ``fmt``, or Parquet to stdout.
        OSError: The output cannot be created.
    """

    def __init__(self, path: str | os.PathLike, *, fmt: str | None = None, ordered: bool = True,
                 row_group_size: int = 1024) -> None:
        self.path = os.fspath(path)
        self.fmt = output_format(self.path, fmt)
        if self.fmt == "parquet" and self.path == STDIN:
            raise ValueError("Parquet cannot be written to stdout; give a .parquet path")
        self._ordered = ordered
        self._pending: dict[int, list[dict]] = {}
        self._next = 0
        self._num_written = 0
        self._closed = False
        self._sink: _JsonlSink | _ParquetSink
        if self.fmt == "jsonl":
            self._sink = _JsonlSink(self.path)
        else:
            self._sink = _ParquetSink(self.path, row_group_size)

    def add(self, index: int, record: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Add the result of input row ``index`` (0-based); writes whatever became contiguous.

        Args:
            index: ``Row.index`` of the row; each index is added once.
            record: The result (keys ``id``, ``text``, ``finish_reason``, ``prompt_tokens``,
                ``completion_tokens``, optionally ``error`` and extra keys), or a sequence of
                such records written consecutively.

        Raises:
            ValueError: The writer is closed, or (ordered mode) the index is negative or was
                already added.
        """
        if self._closed:
            raise ValueError("the writer is closed")
        records = [dict(record)] if isinstance(record, Mapping) else [dict(r) for r in record]
        if not self._ordered:
            self._emit(records)
            return
        if index < 0 or index < self._next or index in self._pending:
            raise ValueError(f"result for row {index} was already added or is invalid")
        self._pending[index] = records
        if index != self._next:
            return
        ready: list[dict] = []
        while self._next in self._pending:
            ready.extend(self._pending.pop(self._next))
            self._next += 1
        self._emit(ready)

    def close(self) -> None:
        """Write what is still buffered and finish the file (idempotent).

        Records still waiting for an earlier row that never came (an interrupted run) are
        written too, in index order, so no finished result is lost; for Parquet, the temporary
        file is then renamed over ``path``.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for index in sorted(self._pending):
                self._emit(self._pending.pop(index))
        finally:
            self._sink.close()

    @property
    def num_written(self) -> int:
        """Records released from the reorder buffer to the output (JSONL: written, flushed)."""
        return self._num_written

    @property
    def num_pending(self) -> int:
        """Rows waiting in the reorder buffer for an earlier row."""
        return len(self._pending)

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, records: list[dict]) -> None:
        if records:
            self._sink.write(records)
            self._num_written += len(records)


def output_format(path: str, fmt: str | None = None) -> str:
    """The output format: ``fmt`` if given, Parquet for ``.parquet``/``.pq``, else JSONL."""
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise ValueError(f"unknown format {fmt!r}; expected jsonl or parquet")
        return fmt
    return "parquet" if os.path.splitext(path)[1].lower() in PARQUET_EXTENSIONS else "jsonl"


def _json_default(value: Any) -> Any:
    # NOTE: never fail on a value: a result that cannot be written would be lost.
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    return str(value)


class _JsonlSink:
    def __init__(self, path: str) -> None:
        self._own = path != STDIN
        self._f = open(path, "w", encoding="utf-8", newline="\n") if self._own else sys.stdout

    def write(self, records: list[dict]) -> None:
        self._f.write("".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n"
                              for r in records))
        self._f.flush()

    def close(self) -> None:
        if self._own:
            self._f.close()
        else:
            self._f.flush()


class _ParquetSink:
    def __init__(self, path: str, row_group_size: int) -> None:
        import pyarrow as pa

        self._pa = pa
        self._path = path
        self._dir = os.path.dirname(os.path.abspath(path))
        self._tmp = self._new_tmp()
        self._row_group_size = max(1, row_group_size)
        self._buffer: list[dict] = []
        # Column types so far; the core columns start at their stable types, id undecided.
        self._types: dict[str, Any] = {
            "id": pa.null(), "text": pa.string(), "finish_reason": pa.string(),
            "prompt_tokens": pa.int64(), "completion_tokens": pa.int64(),
            "cached_tokens": pa.int64(), "error": pa.string()}
        self._schema: Any = None  # the schema written so far (None: nothing written yet)
        self._writer: Any = None

    def _new_tmp(self) -> str:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self._path)}.", suffix=".tmp",
                                   dir=self._dir)
        os.close(fd)
        return tmp

    def write(self, records: list[dict]) -> None:
        self._buffer.extend(records)
        while len(self._buffer) >= self._row_group_size:
            self._flush(self._buffer[: self._row_group_size])
            del self._buffer[: self._row_group_size]

    def close(self) -> None:
        try:
            self._flush(self._buffer)
            self._buffer.clear()
            if self._writer is None:
                self._open(self._resolved_schema())
            self._writer.close()
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(self._tmp, 0o666 & ~mask)  # mkstemp makes 0600
            os.replace(self._tmp, self._path)
        except BaseException:
            if self._writer is not None:
                self._writer.close()
            if os.path.exists(self._tmp):
                os.remove(self._tmp)
            raise

    def _flush(self, records: list[dict]) -> None:
        if not records:
            return
        for key in dict.fromkeys(k for r in records for k in r):
            self._types[key] = _merge_type(self._pa, self._types.get(key, self._pa.null()),
                                           _infer_type(self._pa, [r.get(key) for r in records]))
        schema = self._resolved_schema()
        if self._writer is None:
            self._open(schema)
        elif not schema.equals(self._schema):
            self._rewrite(schema)
        self._writer.write_table(_to_table(self._pa, records, schema))

    def _resolved_schema(self) -> Any:
        pa = self._pa
        return pa.schema([(k, pa.int64() if k == "id" and pa.types.is_null(t) else t)
                          for k, t in self._types.items()])

    def _open(self, schema: Any) -> None:
        import pyarrow.parquet as pq

        self._writer = pq.ParquetWriter(self._tmp, schema)
        self._schema = schema

    def _rewrite(self, schema: Any) -> None:
        # NOTE: a column widened: copy what was written so far into a new temporary file under
        # the new schema, one row group at a time (memory stays bounded).
        import pyarrow.parquet as pq

        self._writer.close()
        old = self._tmp
        self._tmp = self._new_tmp()
        self._open(schema)
        try:
            pf = pq.ParquetFile(old)
            for i in range(pf.num_row_groups):
                self._writer.write_table(_to_table(self._pa, pf.read_row_group(i).to_pylist(),
                                                   schema))
        finally:
            os.remove(old)


def _infer_type(pa: Any, values: list) -> Any:
    try:
        return pa.array(values).type
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.string()  # values that cannot share a type: stored JSON-encoded


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
                      else json.dumps(v, ensure_ascii=False, default=_json_default)
                      for v in values]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
