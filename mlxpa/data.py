"""Batch input and output: read validated rows, write results in input order.

The public face of :mod:`mlxpa.data_read` (JSONL/Parquet/stdin readers, :class:`Row`,
:class:`InputError`) and :mod:`mlxpa.data_write` (:class:`ResultWriter`), split in two to keep
each file small (STYLE.md §9.1). Pure Python and pyarrow; no MLX.

Data flow (STYLE.md §15)::

    read_rows(source) -> Row(index, id, prompt | messages, params, error)
        -> engine request (request_id = Row.index) -> result record
        -> ResultWriter.add(Row.index, record)   # reorder buffer -> input order on disk
"""

from __future__ import annotations

from mlxpa.data_read import (
    FORMATS,
    SAMPLING_FIELDS,
    STDIN,
    InputError,
    Row,
    input_format,
    read_rows,
)
from mlxpa.data_write import CORE_COLUMNS, ResultWriter, output_format

__all__ = [
    "CORE_COLUMNS",
    "FORMATS",
    "SAMPLING_FIELDS",
    "STDIN",
    "InputError",
    "ResultWriter",
    "Row",
    "input_format",
    "output_format",
    "read_rows",
]
