"""Batch input and output: read validated rows, write results in input order.

The public face of the ``data_*`` modules, split to keep each file one concern (STYLE.md
§9.1). Pure Python, pyarrow and ``datasets``; no MLX.

* :mod:`mlxpa.data.rows`: one record to a validated :class:`Row` (:class:`InputError`);
  :mod:`mlxpa.data.params`: its sampling fields;
* :mod:`mlxpa.data.read`: JSONL / Parquet / CSV / stdin readers; :mod:`mlxpa.data.hf`:
  ``datasets`` folders and files;
* :mod:`mlxpa.data.validate`: the validation pass before any model work;
* :mod:`mlxpa.data.records`: result records (mlxpa rows or OpenAI Batch output lines);
* :mod:`mlxpa.data.write`: :class:`ResultWriter` (reorder buffer, JSONL);
  :mod:`mlxpa.data.parquet`: crash-safe Parquet output;
* :mod:`mlxpa.data.resume`: what an existing output already holds (``--resume``).

Data flow (STYLE.md §15)::

    read_rows(source) -> Row(index, id, prompt | messages, params, error)
        -> engine request (request_id = Row.index) -> result record
        -> ResultWriter.add(Row.index, record)   # reorder buffer -> input order on disk
"""

from __future__ import annotations

from mlxpa.data.params import SAMPLING_FIELDS
from mlxpa.data.read import (
    FORMATS,
    STDIN,
    InputOptions,
    input_format,
    read_rows,
    spool_stdin,
)
from mlxpa.data.rows import InputError, Row
from mlxpa.data.write import CORE_COLUMNS, ResultWriter, output_format

__all__ = [
    "CORE_COLUMNS",
    "FORMATS",
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
