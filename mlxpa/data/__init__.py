"""Batch input and output: read validated rows, write results in input order. Pure Python,
pyarrow and ``datasets``; no MLX.

* :mod:`~mlxpa.data.inputs`: :class:`InputOptions` (the reader settings), :class:`InputError`,
  column checks; :mod:`~mlxpa.data.rows`: one record to a validated :class:`Row`;
  :mod:`~mlxpa.data.params`: its sampling fields;
* :mod:`~mlxpa.data.read`: JSONL / Parquet / CSV / stdin readers; :mod:`~mlxpa.data.hf`:
  ``datasets`` folders and files;
* :mod:`~mlxpa.data.validate`: the validation pass before any model work;
* :mod:`~mlxpa.data.schema`: the output columns and their types;
  :mod:`~mlxpa.data.records`: result records (mlxpa rows or OpenAI Batch output lines);
* :mod:`~mlxpa.data.write`: :class:`ResultWriter` (reorder buffer);
  :mod:`~mlxpa.data.jsonl` and :mod:`~mlxpa.data.parquet`: the two sinks (Parquet crash-safe);
* :mod:`~mlxpa.data.resume`: what an existing output already holds (``--resume``);
  :mod:`~mlxpa.data.order`: a resumed output put back in input order.

Data flow::

    read_rows(source, options) -> Row(index, id, prompt | messages, params, error)
        -> engine request (request_id: the row's id as text) -> result record
        -> ResultWriter.add(Row.index, record)   # reorder buffer -> input order on disk
"""

from __future__ import annotations

from mlxpa.data.inputs import InputError, InputOptions
from mlxpa.data.params import SAMPLING_FIELDS
from mlxpa.data.read import STDIN, input_format, read_rows, spool_stdin
from mlxpa.data.rows import Row
from mlxpa.data.write import ResultWriter, output_format

__all__ = [
    "SAMPLING_FIELDS",
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
