"""Input rows for a batch run: JSONL, Parquet, CSV and ``datasets`` readers (or ``-``, stdin).

Every input record becomes a :class:`~mlxpa.data.rows.Row` (validated by
:func:`~mlxpa.data.rows.parse_row`) with its 0-based ``index`` (the request id inside the
engine). Two kinds of problems are told apart (DESIGN.md "Input and output"):

* the input as a whole cannot be read (no such file, an unreadable Parquet file, no
  prompt/messages column, a hub dataset name): :class:`InputError`, raised;
* one record is bad (invalid JSON or UTF-8, a line that is not an object, a missing or empty
  prompt, a wrongly typed or unknown sampling field): a ``Row`` whose ``error`` names the
  source, line and field, so a validation pass can list the problems before any model work or,
  with ``--skip-invalid``, give that row an error result.

Locations: JSONL and CSV lines are 1-based physical line numbers (blank lines counted, so an
editor's "go to line" finds them, while ``Row.index`` skips them; a CSV header is line 1);
Parquet and ``datasets`` rows are 0-based row numbers, called "row" in messages
(``data.parquet row 0: ...``). A UTF-8 byte order mark is accepted; blank JSONL lines are
skipped.

Reading is lazy: JSONL and CSV line by line, Parquet one row group at a time, ``datasets``
by batches of a memory-mapped table, so memory does not grow with the file (STYLE.md §15).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mlxpa.data.columnar import STDIN, binary_stdin, iter_csv, iter_parquet
from mlxpa.data.params import coerce_text_fields
from mlxpa.data.rows import (
    InputError,
    Row,
    RowSpec,
    bad_record_row,
    json_type,
    parse_row,
)

STDIN_NAME = "<stdin>"
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonlines", ".json")
PARQUET_EXTENSIONS = (".parquet", ".pq")
CSV_EXTENSIONS = (".csv", ".tsv")
FORMATS = ("jsonl", "parquet", "csv", "hf")
CORE_COLUMNS = ("id", "text", "finish_reason", "prompt_tokens", "completion_tokens",
                "cached_tokens", "error")
# Output field names (mlxpa rows, OpenAI Batch lines): a kept input column may not clash.
OUTPUT_FIELDS = frozenset((*CORE_COLUMNS, "sample_index", "custom_id", "response"))

__all__ = ["FORMATS", "STDIN", "InputError", "InputOptions", "Row", "input_format",
           "read_rows", "spool_stdin"]


def read_rows(source: str | os.PathLike, *, fmt: str | None = None,
              prompt_column: str = "prompt", messages_column: str = "messages",
              id_column: str = "id", system: str | None = None,
              keep_columns: tuple[str, ...] = (), name: str | None = None) -> Iterator[Row]:
    """Read and validate input rows lazily.

    Args:
        source: A file path, a ``datasets`` folder, or ``"-"`` for stdin.
        fmt: One of :data:`FORMATS`, or None to choose by :func:`input_format`.
        prompt_column: Field holding the text prompt.
        messages_column: Field holding chat messages.
        id_column: Field holding the row id.
        system: A system message put before every prompt (see
            :func:`~mlxpa.data.rows.parse_row`).
        keep_columns: Fields copied into ``Row.keep``.
        name: The source's name in messages (default: ``source``, ``"<stdin>"`` for ``-``).

    Returns:
        An iterator of rows in input order. Record-level problems are ``Row.error``s;
        problems with the whole input surface as ``InputError`` while iterating.

    Raises:
        InputError: At call time, when the file does not exist or its format cannot be told.
        ValueError: When ``fmt`` is not one of ``FORMATS``.
    """
    source = os.fspath(source)
    fmt = input_format(source, fmt)
    name = name or (STDIN_NAME if source == STDIN else source)
    spec = RowSpec(name, "line" if fmt in ("jsonl", "csv") else "row", prompt_column,
                   messages_column, id_column, system, tuple(keep_columns))
    if fmt == "hf":
        from mlxpa.data.hf import iter_hf_records

        records = iter_hf_records(source, spec)
    elif source != STDIN and not os.path.isfile(source):
        raise InputError("no such file", source=name)
    else:
        records = {"jsonl": _iter_jsonl, "parquet": iter_parquet, "csv": iter_csv}[fmt](
            source, spec)
    return _rows(records, spec, coerce=fmt == "csv")


@dataclass(frozen=True, slots=True)
class InputOptions:
    """How to read the input (the ``read_rows`` settings).

    Attributes:
        fmt: ``jsonl``, ``parquet``, ``csv``, ``hf``, or None (by extension).
        prompt_column: Field of the text prompt.
        messages_column: Field of the chat messages.
        id_column: Field of the row id.
        system: System message put before every prompt.
        keep_columns: Input fields copied to every output record.
        split_special_tokens: Tokenize control-token text in a ``prompt`` as ordinary text
            (chat ``messages`` always are); see :func:`mlxpa.prompts.prompt_token_ids`.

    Raises:
        ValueError: An unknown format, or a kept column named like an output field.
    """

    fmt: str | None = None
    prompt_column: str = "prompt"
    messages_column: str = "messages"
    id_column: str = "id"
    system: str | None = None
    keep_columns: tuple[str, ...] = ()
    split_special_tokens: bool = False

    def __post_init__(self) -> None:
        if self.fmt is not None and self.fmt not in FORMATS:
            raise ValueError(f"input format must be one of {', '.join(FORMATS)}, "
                             f"got {self.fmt!r}")
        clash = set(self.keep_columns) & OUTPUT_FIELDS
        if clash:
            raise ValueError(f"keep columns {', '.join(sorted(clash))}: an output field has "
                             "that name")

    def read(self, source: str, fmt: str | None = None, name: str | None = None) -> Iterator[Row]:
        """:func:`read_rows` of ``source`` with these settings (``fmt`` overrides ``self.fmt``;
        ``name`` is the source's name in messages)."""
        return read_rows(source, fmt=fmt or self.fmt, prompt_column=self.prompt_column,
                         messages_column=self.messages_column, id_column=self.id_column,
                         system=self.system, keep_columns=self.keep_columns, name=name)


def input_format(source: str, fmt: str | None = None) -> str:
    """The input format of ``source``: ``fmt`` if given, else ``hf`` for a folder or a name
    that is not a local path (a hub dataset id), else by extension (stdin is JSONL).

    Raises:
        ValueError: ``fmt`` is not a known format.
        InputError: ``fmt`` is None and the extension is not a known one.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        return fmt
    if source == STDIN:
        return "jsonl"
    ext = os.path.splitext(source)[1].lower()
    if os.path.isdir(source) or (not os.path.exists(source) and not ext):
        return "hf"
    for kind, exts in (("parquet", PARQUET_EXTENSIONS), ("jsonl", JSONL_EXTENSIONS),
                       ("csv", CSV_EXTENSIONS)):
        if ext in exts:
            return kind
    raise InputError(f"cannot tell the format from the extension {ext or '(none)'!r}; "
                     "use .jsonl, .parquet or .csv, or give the format", source=source)


def spool_stdin(fmt: str) -> str:
    """Copy stdin to a temporary file (so it can be read twice: validate, then run).

    Returns:
        The file's path (the caller removes it); its extension matches ``fmt``.
    """
    ext = {"jsonl": ".jsonl", "parquet": ".parquet", "csv": ".csv"}.get(fmt, ".jsonl")
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
                obj = coerce_text_fields(obj, spec.messages_column)
            yield parse_row(obj, index, line, spec)


def _iter_jsonl(source: str, spec: RowSpec) -> Records:
    if source == STDIN:
        yield from _jsonl_lines(binary_stdin())
    else:
        with open(source, "rb") as f:
            yield from _jsonl_lines(f)


def _jsonl_lines(lines: Any) -> Records:
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
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            yield lineno, f"invalid JSON ({e.msg} at column {e.colno})"
            continue
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, deep nesting
            yield lineno, f"unreadable JSON ({_reason(e)})"
            continue
        if isinstance(obj, dict):
            yield lineno, obj
        else:
            yield lineno, f"expected a JSON object, got {json_type(obj)}"


def _reason(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)

