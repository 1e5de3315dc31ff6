"""File formats: input rows in, result rows out, in input order. Pure Python, pyarrow and
``datasets``; no MLX.

* :mod:`~mlxpa.data.reader_options` (the reader settings), :mod:`~mlxpa.data.read` (JSONL,
  Parquet, CSV, text, stdin), :mod:`~mlxpa.data.hf` (``datasets``), :mod:`~mlxpa.data.rows`
  (the row envelope around the request schema of :mod:`mlxpa.inputs.schema`: the id column,
  OpenAI Batch lines, ``--keep-columns``);
* :mod:`~mlxpa.data.validate` (the validation pass before any model work);
* :mod:`~mlxpa.data.schema` (the output columns), :mod:`~mlxpa.data.records` (result records),
  :mod:`~mlxpa.data.write` (:class:`ResultWriter`, a reorder buffer), :mod:`~mlxpa.data.jsonl`
  and :mod:`~mlxpa.data.parquet` (the sinks), :mod:`~mlxpa.data.resume` and
  :mod:`~mlxpa.data.order` (``--resume``).
"""

from __future__ import annotations

from mlxpa.data.read import STDIN, input_format, read_rows, spool_stdin
from mlxpa.data.reader_options import InputError, InputOptions
from mlxpa.data.rows import Row
from mlxpa.data.write import ResultWriter, output_format

__all__ = [
    "STDIN",
    "InputError",
    "InputOptions",
    "ResultWriter",
    "Row",
    "input_format",
    "output_format",
    "read_rows",
    "spool_stdin",
]
