"""Input rows for a batch run: JSONL, Parquet, CSV and ``datasets`` readers (or ``-``, stdin).

Every input record becomes a :class:`~mlxpa.data.rows.Row` (read by
:func:`~mlxpa.data.rows.parse_row`) with its 0-based ``index``. An input that cannot be read as
a whole (no such file, no prompt column, a hub dataset name) raises :class:`InputError`; a bad
record becomes a ``Row`` whose ``error`` names the source, line and field, so a validation pass
can list the problems before any model work, or ``--skip-invalid`` can give it an error result.

Locations: JSONL and CSV lines are 1-based physical line numbers (blank lines counted, so an
editor's "go to line" finds them; a CSV header is line 1); Parquet and ``datasets`` rows are
0-based row numbers, called "row" in messages. Reading is lazy (JSONL and CSV line by line,
Parquet in batches of at most 1,024 rows, ``datasets`` by batches of a memory-mapped table), so
memory does not grow with the file; and no format refuses a row another accepts (no CSV cell
size limit; JSON nested too deeply or with a 4,300-digit integer is a row error).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from mlxpa.data.reader_options import (
    InputError,
    InputOptions,
    RowSpec,
    check_columns,
    check_format,
)
from mlxpa.data.rows import Row, bad_record_row, parse_row
from mlxpa.inputs.schema import PROMPT_FIELDS, SAMPLING_FIELDS
from mlxpa.messages import json_type
from mlxpa.structured.fields import JSON_TEXT_FIELDS

STDIN = "-"
STDIN_NAME = "<stdin>"
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonlines", ".json")
PARQUET_EXTENSIONS = (".parquet", ".pq")
CSV_EXTENSIONS = (".csv", ".tsv")
TEXT_EXTENSIONS = (".txt",)
LINE_FORMATS = ("jsonl", "csv", "txt")  # formats whose problems name a line, not a row

__all__ = ["STDIN", "STDIN_NAME", "input_format", "read_rows", "spool_stdin", "unit_of"]


def unit_of(fmt: str) -> str:
    """What messages call a record of format ``fmt``: ``line`` (JSONL, CSV, text: 1-based
    physical lines) or ``row`` (Parquet, ``datasets``: 0-based rows)."""
    return "line" if fmt in LINE_FORMATS else "row"


def read_rows(source: str | os.PathLike, options: InputOptions | None = None, *,
              name: str | None = None, **settings: Any) -> Iterator[Row]:
    """Read and validate input rows lazily.

    Args:
        source: A file path, a ``datasets`` folder, or ``"-"`` for stdin.
        options: The reader settings; None builds them from ``settings``.
        name: The source's name in messages (default: ``source``, ``"<stdin>"`` for ``-``).
        **settings: :class:`~mlxpa.data.reader_options.InputOptions` fields (``fmt``,
            ``prompt_column``, ...), when ``options`` is None.

    Returns:
        An iterator of rows in input order. Record-level problems are ``Row.error``s;
        problems with the whole input surface as ``InputError`` while iterating.

    Raises:
        InputError: At call time, when the file does not exist or its format cannot be told.
        ValueError: When ``fmt`` is not one of :data:`~mlxpa.data.reader_options.FORMATS`.
    """
    options = options if options is not None else InputOptions(**settings)
    source = os.fspath(source)
    fmt = input_format(source, options.fmt)
    name = name or (STDIN_NAME if source == STDIN else source)
    spec = RowSpec(name, unit_of(fmt), options)
    if fmt == "hf":
        from mlxpa.data.hf import iter_hf_records

        records = iter_hf_records(source, spec)
    elif source != STDIN and not os.path.isfile(source):
        raise InputError("no such file", source=name)
    else:
        records = {"jsonl": _iter_jsonl, "parquet": _iter_parquet, "csv": _iter_csv,
                   "txt": _iter_text}[fmt](source, spec)
    return _rows(records, spec, coerce=fmt == "csv")


def input_format(source: str, fmt: str | None = None) -> str:
    """The input format of ``source``: ``fmt`` if given, else ``hf`` for a folder or a name
    that is not a local path (a hub dataset id), else by extension (stdin is JSONL).

    Raises:
        ValueError: ``fmt`` is not a known format.
        InputError: ``fmt`` is None and the extension is not a known one.
    """
    if fmt is not None:
        return check_format(fmt)
    if source == STDIN:
        return "jsonl"
    ext = os.path.splitext(source)[1].lower()
    if os.path.isdir(source) or (not os.path.exists(source) and not ext):
        return "hf"
    for kind, exts in (("parquet", PARQUET_EXTENSIONS), ("jsonl", JSONL_EXTENSIONS),
                       ("csv", CSV_EXTENSIONS), ("txt", TEXT_EXTENSIONS)):
        if ext in exts:
            return kind
    raise InputError(f"cannot tell the format from the extension {ext or '(none)'!r}; "
                     "use .jsonl, .parquet, .csv or .txt, or give --input-format "
                     "jsonl|parquet|csv|txt|hf", source=source)


def spool_stdin(fmt: str) -> str:
    """Copy stdin to a temporary file (so it can be read twice: validate, then run).

    Returns:
        The file's path (the caller removes it); its extension matches ``fmt``.
    """
    ext = {"jsonl": ".jsonl", "parquet": ".parquet", "csv": ".csv", "txt": ".txt"}.get(
        fmt, ".jsonl")
    fd, path = tempfile.mkstemp(prefix="mlxpa-stdin-", suffix=ext)
    stream = getattr(sys.stdin, "buffer", None)
    with os.fdopen(fd, "wb") as f:
        if stream is not None:
            shutil.copyfileobj(stream, f, 1 << 20)
        else:  # a text stream without bytes (tests)
            for chunk in iter(lambda: sys.stdin.read(1 << 16), ""):
                f.write(chunk.encode("utf-8"))
    return path


# A record source yields (location, decoded record or a problem string).
Records = Iterator[tuple[int, Any]]


def _rows(records: Records, spec: RowSpec, coerce: bool) -> Iterator[Row]:
    for index, (line, obj) in enumerate(records):
        if isinstance(obj, str):
            yield bad_record_row(obj, index, line, spec)
        else:
            if coerce:
                obj = coerce_text_fields(obj, spec.options.messages_column)
            yield parse_row(obj, index, line, spec)


def _binary_stdin() -> Any:
    # NOTE: read bytes where we can so the encoding is UTF-8 whatever the locale says.
    return getattr(sys.stdin, "buffer", sys.stdin)


def _iter_jsonl(source: str, spec: RowSpec) -> Records:
    if source == STDIN:
        yield from _jsonl_lines(_binary_stdin(), spec.source)
    else:
        with open(source, "rb") as f:
            yield from _jsonl_lines(f, spec.source)


def _starts_json_array(line: str) -> bool:
    """Whether a file's first line opens a JSON array of rows: ``[`` that does not close on
    the line (an array spread over lines), or a whole array of objects on one line. A line
    holding another complete array (``[1, 2]``) is a row of JSON Lines, invalid on its own."""
    if not line.lstrip().startswith("["):
        return False
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return True
    return bool(value) and all(isinstance(v, dict) for v in value)


def _jsonl_lines(lines: Any, name: str) -> Records:
    seen = False  # a non-blank line before this one
    for lineno, raw in enumerate(lines, 1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, f"not valid UTF-8 ({e.reason} at byte {e.start + 1})"
                continue
        if lineno == 1:
            raw = raw.removeprefix("\ufeff")
        if not raw.strip():
            continue
        if not seen and _starts_json_array(raw):
            stem = os.path.splitext(name)[0] if name != STDIN_NAME else "input"
            stem += ".lines" if stem + ".jsonl" == name else ""
            raise InputError("the file is a JSON array ([...]), not JSON Lines (one object per "
                             f"line); convert it with: jq -c '.[]' {shlex.quote(name)} > "
                             f"{shlex.quote(stem + '.jsonl')}", source=name)
        seen = True
        try:  # without its line end, so an unclosed object ends where the line's JSON does
            obj = json.loads(raw.rstrip("\r\n"))
        except json.JSONDecodeError as e:  # json's own words: "Expecting ',' delimiter: column 16"
            yield lineno, f"invalid JSON ({e.msg}: column {e.colno})"
            continue
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, deep nesting
            yield lineno, f"unreadable JSON ({_reason(e)})"
            continue
        if isinstance(obj, dict):
            yield lineno, obj
        else:
            yield lineno, f"expected a JSON object, got {json_type(obj)}"


def _iter_text(source: str, spec: RowSpec) -> Records:
    """Plain text: each non-blank line is one prompt (trailing newline removed)."""
    f = _binary_stdin() if source == STDIN else open(source, "rb")
    try:
        for lineno, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            except UnicodeDecodeError as e:
                yield lineno, f"not valid UTF-8 ({e.reason} at byte {e.start + 1})"
                continue
            text = (text.removeprefix("\ufeff") if lineno == 1 else text).rstrip("\r\n")
            if text.strip():
                yield lineno, {spec.options.prompt_column: text}
    finally:
        if source != STDIN:
            f.close()


def _reason(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


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


def _iter_csv(source: str, spec: RowSpec) -> Records:
    _raise_csv_field_limit()
    delimiter = "\t" if source.lower().endswith(".tsv") else ","
    if source == STDIN:
        f = io.TextIOWrapper(_binary_stdin(), encoding="utf-8-sig", newline="")
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


def _iter_parquet(source: str, spec: RowSpec) -> Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if source == STDIN:
            pf = pq.ParquetFile(pa.BufferReader(_binary_stdin().read()))
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
    """Rows per decoded Parquet batch: 1,024, or fewer when rows are large (MBs of text each),
    so that a batch's Python objects stay near ``target_bytes``."""
    meta = pf.metadata
    widest = max((meta.row_group(i).total_byte_size / max(1, meta.row_group(i).num_rows)
                  for i in range(meta.num_row_groups)), default=0)
    return int(max(1, min(1024, target_bytes // max(1, widest))))


def coerce_text_fields(obj: dict[str, str], messages_column: str) -> dict[str, Any]:
    """Types for a row whose values are all text (CSV): empty cells are null, sampling fields,
    ``messages`` and ``questions`` are parsed (JSON for lists and objects; ``stop`` may be
    plain text), and a value that does not parse is kept as text so validation names it."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if value is None or value == "":
            out[key] = None
        elif key in (messages_column, "questions", "add_special_tokens") or (
                key in SAMPLING_FIELDS and key != "stop") or (
                key in JSON_TEXT_FIELDS or key in PROMPT_FIELDS):
            out[key] = _loads(value.lower() if value.lower() in ("true", "false") else value)
        elif key == "stop" and value.startswith("["):
            out[key] = _loads(value)
        else:
            out[key] = value
    return out


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # kept as text: validation names the field
        return text
