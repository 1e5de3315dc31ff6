"""Result writers: JSONL (a file or stdout) and Parquet, in input order via a reorder buffer.

Records are added as rows finish, keyed by ``Row.index``. In ordered mode (the default) a record
waits in the reorder buffer until every earlier index is done (or skipped: already in the
output on ``--resume``), then it and every contiguous successor are released at once: JSONL
writes them and flushes, so finished results are on disk (or down the pipe) as soon as order
allows and nothing is held back to the end. Unordered mode writes each record as it comes.

JSONL is appended to on ``--resume`` (after :mod:`mlxpa.data.resume` cut a torn last line).
Parquet goes through :class:`~mlxpa.data.parquet.ParquetSink`: finished row groups on disk as
they fill, one file renamed over the target at the end. An ordered ``--resume`` puts the whole
output back in input order when it closes (:mod:`mlxpa.data.order`): the rows an earlier run
wrote and the rows this run appended.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from mlxpa.data.jsonl import JsonlSink
from mlxpa.data.order import jsonl_in_order
from mlxpa.data.read import PARQUET_EXTENSIONS, STDIN

__all__ = ["OutputClosedError", "ResultWriter", "output_format"]


class OutputClosedError(BrokenPipeError):
    """The reader of the output went away (``mlxpa run x.jsonl | head -1``): the pipe is
    closed. ``num_written`` records were written before it closed."""

    def __init__(self, num_written: int) -> None:
        super().__init__(f"the output was closed after {num_written} record(s)")
        self.num_written = num_written


class ResultWriter:
    """Write result records in input order to JSONL (file or stdout) or Parquet.

    ``add(index, record)`` takes the record for input row ``index``; a sequence of records
    (one per sample when n > 1) is also accepted and written consecutively. Use as a context
    manager: ``close`` runs on exit, also after an exception, so finished rows are kept (on
    ``KeyboardInterrupt`` a Parquet output keeps its finished row groups in the parts folder
    for ``--resume`` instead of spending time on the merge).

    Args:
        path: Output path, or ``"-"`` for stdout (JSONL only; nothing else may write there).
        fmt: ``"jsonl"`` or ``"parquet"``; None picks Parquet for ``.parquet``/``.pq`` and
            JSONL otherwise.
        ordered: Write in input order (reorder buffer); False writes records as they come.
        row_group_size: Parquet records per row group (bounds the writer's memory).
        append: Keep what the output already holds and add to it (``--resume``).
        positions: With ``append`` and ``ordered``: the input index of each id key the output
            already holds (``Validation.done``); ``close`` then rewrites the output in input
            order (None: the earlier rows stay first, the new ones follow).

    Raises:
        ValueError: Unknown ``fmt``, or Parquet to stdout.
        OSError: The output cannot be created.
    """

    def __init__(self, path: str | os.PathLike, *, fmt: str | None = None, ordered: bool = True,
                 row_group_size: int = 1024, append: bool = False,
                 positions: Mapping[str, int] | None = None) -> None:
        self.path = os.fspath(path)
        self.fmt = output_format(self.path, fmt)
        if self.fmt == "parquet" and self.path == STDIN:
            raise ValueError("Parquet cannot be written to stdout; give a .parquet path")
        self._ordered = ordered
        self._pending: dict[int, list[dict]] = {}
        self._next = 0
        self._num_written = 0
        self._closed = self._broken = False
        self._positions = positions if append and ordered else None
        self._new_index = array("q")  # with positions: the input index of each record written
        self._base_end = 0
        self._sink: Any
        if self.fmt == "jsonl":
            if self._positions is not None and os.path.isfile(self.path):
                self._base_end = os.path.getsize(self.path)
            self._sink = JsonlSink(self.path, append)
        else:
            from mlxpa.data.parquet import ParquetSink

            self._sink = ParquetSink(self.path, row_group_size, append)

    def add(self, index: int, record: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Add the result of input row ``index`` (0-based); writes whatever became contiguous.

        Args:
            index: ``Row.index`` of the row; each index is added (or skipped) once.
            record: The result (keys ``id``, ``text``, ``finish_reason``, ``prompt_tokens``,
                ``completion_tokens``, optionally ``error`` and extra keys), or a sequence of
                such records written consecutively (an empty one writes nothing).

        Raises:
            ValueError: The writer is closed, or (ordered mode) the index is negative or was
                already added.
        """
        if self._closed:
            raise ValueError("the writer is closed")
        records = [dict(record)] if isinstance(record, Mapping) else [dict(r) for r in record]
        if not self._ordered:
            self._emit([(index, records)])
            return
        if index < 0 or index < self._next or index in self._pending:
            raise ValueError(f"result for row {index} was already added or is invalid")
        self._pending[index] = records
        if index != self._next:
            return
        ready: list[tuple[int, list[dict]]] = []
        while self._next in self._pending:
            ready.append((self._next, self._pending.pop(self._next)))
            self._next += 1
        self._emit(ready)

    def skip(self, index: int) -> None:
        """Mark row ``index`` as needing no output (already written by an earlier run)."""
        self.add(index, [])

    def close(self, interrupted: bool = False, reorder: bool = True) -> None:
        """Write what is still buffered and finish the file (idempotent).

        Records still waiting for an earlier row that never came (an interrupted run) are
        written too, in index order, so no finished result is lost; for Parquet, the finished
        row groups are then merged into ``path`` (unless ``interrupted``). A run stopped
        (``interrupted``, or not ``reorder``) before any row was written leaves no output
        behind, nor changes an existing one (a plain rerun then starts afresh). With ``positions``
        (an ordered resume), unless ``interrupted`` or not ``reorder`` (a stopped run: the
        next resume does it), the output is then rewritten in input order.

        Raises:
            OSError: The output cannot be written (a failed rewrite leaves it as it was).
        """
        if self._closed:
            return
        self._closed = True
        if self._broken:  # nothing more can be written (or flushed) to a closed pipe
            return
        positions = None if interrupted or not reorder else self._positions
        try:
            self._emit([(i, self._pending.pop(i)) for i in sorted(self._pending)])
        finally:
            # stopped (interrupted, or not reorder) before any row: no output to leave behind
            nothing = (interrupted or not reorder) and self._num_written == 0
            if self.fmt == "parquet":
                self._sink.close(merge=not (interrupted or nothing), positions=positions,
                                 new_index=self._new_index)
            else:
                self._sink.close(create=not nothing)
        if self.fmt == "jsonl" and positions is not None:
            jsonl_in_order(self.path, positions, self._base_end, self._new_index)

    @property
    def num_written(self) -> int:
        """Records released from the reorder buffer to the output (JSONL: written, flushed)."""
        return self._num_written

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt),
                   reorder=exc_type is None)

    def _emit(self, groups: list[tuple[int, list[dict]]]) -> None:
        groups = [(i, g) for i, g in groups if g]
        if groups:
            try:
                self._sink.write([g for _, g in groups])
            except BrokenPipeError:
                self._broken = True
                raise OutputClosedError(self._num_written) from None
            if self._positions is not None:  # only a resume that will be sorted needs them
                for index, records in groups:
                    self._new_index.extend([index] * len(records))
            self._num_written += sum(len(g) for _, g in groups)


JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")


def output_format(path: str, fmt: str | None = None) -> str:
    """The output format: ``fmt`` if given, Parquet for ``.parquet``/``.pq``, JSONL for
    ``-`` and ``.jsonl``/``.json``/``.ndjson``.

    Raises:
        ValueError: An unknown ``fmt``, or another extension (``out.csv`` would get JSONL).
    """
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise ValueError(f"unknown format {fmt!r}; expected jsonl or parquet")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext in PARQUET_EXTENSIONS:
        return "parquet"
    if path == "-" or ext in JSONL_EXTENSIONS:
        return "jsonl"
    raise ValueError(f"-o {path}: results are written as JSONL (.jsonl) or Parquet "
                     "(.parquet); name the file with one of those extensions")
