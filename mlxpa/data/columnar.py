"""CSV/TSV and Parquet record sources (see :mod:`mlxpa.data.read` for locations and errors).

Both stream: CSV line by line with no cell size limit beyond a JSONL line's (Python's
``csv.field_size_limit`` is raised from its 128 KiB default), Parquet in batches of at most
1,024 rows, fewer when rows are large, so a file of multi-MB documents reads in flat memory.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Iterator
from typing import Any

from mlxpa.data.rows import InputError, RowSpec, is_relevant

STDIN = "-"
Records = Iterator[tuple[int, Any]]


def binary_stdin() -> Any:
    # NOTE: read bytes where we can so the encoding is UTF-8 whatever the locale says.
    return getattr(sys.stdin, "buffer", sys.stdin)



def _raise_csv_field_limit() -> None:
    """Python's csv module refuses cells over 128 KiB (``field_size_limit``); a JSONL line or a
    Parquet string has no such limit, so neither has a CSV cell (the largest C long)."""
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:  # a C long narrower than Python's maxsize (Windows)
            limit //= 2


def iter_csv(source: str, spec: RowSpec) -> Records:
    _raise_csv_field_limit()
    delimiter = "\t" if source.lower().endswith(".tsv") else ","
    if source == STDIN:
        f = io.TextIOWrapper(binary_stdin(), encoding="utf-8-sig", newline="")
    else:
        f = open(source, encoding="utf-8-sig", newline="")
    with f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                return
            check_columns(header, spec)
            last = reader.line_num
            for values in reader:
                start, last = last + 1, reader.line_num
                if not values:
                    continue
                if len(values) != len(header):
                    yield start, (f"expected {len(header)} fields as in the header, "
                                  f"got {len(values)}")
                    continue
                yield start, dict(zip(header, values))
        except UnicodeDecodeError as e:
            raise InputError(f"not valid UTF-8 ({e.reason})", source=spec.source) from None
        except csv.Error as e:
            raise InputError(f"malformed CSV ({e})", source=spec.source,
                             line=reader.line_num) from None


def iter_parquet(source: str, spec: RowSpec) -> Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if source == STDIN:
            pf = pq.ParquetFile(pa.BufferReader(binary_stdin().read()))
        else:
            pf = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file ({e})", source=spec.source) from None
    columns = check_columns(pf.schema_arrow.names, spec)
    row = 0
    for batch in pf.iter_batches(batch_size=_batch_rows(pf), columns=columns):
        for obj in batch.to_pylist():
            yield row, obj
            row += 1


def _batch_rows(pf: Any, target_bytes: int = 8 << 20) -> int:
    """Rows per decoded batch: 1,024, or fewer when rows are large (tens of MB of text each),
    so that a batch's Python objects stay near ``target_bytes``."""
    meta = pf.metadata
    widest = max((meta.row_group(i).total_byte_size / max(1, meta.row_group(i).num_rows)
                  for i in range(meta.num_row_groups)), default=0)
    return int(max(1, min(1024, target_bytes // max(1, widest))))


def check_columns(names: list[str], spec: RowSpec) -> list[str]:
    """The columns of ``names`` the reader uses (a column no row can use is not read).

    Raises:
        InputError: There is no prompt or messages column (nor an OpenAI ``body``).
    """
    if spec.prompt_column not in names and spec.messages_column not in names and not (
            "custom_id" in names and "body" in names):
        raise InputError(f'no column "{spec.prompt_column}" or "{spec.messages_column}" '
                         f"(columns: {', '.join(names)})", source=spec.source,
                         field=spec.prompt_column)
    return [n for n in names if is_relevant(n, spec)]
