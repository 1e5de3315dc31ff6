"""A batch run's input: a path, or stdin spooled to a temporary file (every pass reads it
again), with its display name, its format and what its messages call a record."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

from mlxpa.data import InputOptions, Row, input_format, read_rows, spool_stdin
from mlxpa.data.read import STDIN, STDIN_NAME, unit_of
from mlxpa.data.reader_options import where

__all__ = ["STDIN_NAME", "Source", "unit_of"]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """An input as the passes read it.

    Attributes:
        path: The file or ``datasets`` folder to read (a spooled stdin is a file by now).
        name: The input's name in messages (the path as given, or ``<stdin>``).
        inputs: The reader settings, with the format decided.
        spooled: ``path`` is a temporary copy of stdin (removed when :meth:`open` exits).
    """

    path: str
    name: str
    inputs: InputOptions
    spooled: bool = False

    @property
    def unit(self) -> str:
        """``line`` or ``row`` (:func:`~mlxpa.data.read.unit_of`)."""
        return unit_of(self.inputs.fmt)

    def rows(self) -> Iterator[Row]:
        """The input's rows, read from the start (lazily)."""
        return read_rows(self.path, self.inputs, name=self.name)

    def place(self, row: Row) -> str:
        """Where ``row`` is, for messages: ``in.jsonl line 3``, ``data.parquet row 0``."""
        return where(self.name, row.line, self.unit)

    @classmethod
    @contextlib.contextmanager
    def open(cls, source: str, inputs: InputOptions | None = None) -> Iterator[Source]:
        """The input ``source`` (a path, a ``datasets`` folder, or ``-`` for stdin, spooled to
        a temporary file that is removed on exit).

        Raises:
            InputError: ``inputs.fmt`` is None and the extension is not a known one.
            ValueError: An unknown ``inputs.fmt``.
        """
        inputs = inputs or InputOptions()
        fmt = input_format(source, inputs.fmt)
        inputs = dataclasses.replace(inputs, fmt=fmt)
        if source != STDIN or fmt == "hf":
            yield cls(source, source, inputs)
            return
        path = spool_stdin(fmt)
        try:
            yield cls(path, STDIN_NAME, inputs, spooled=True)
        finally:
            os.remove(path)
