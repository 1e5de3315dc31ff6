"""Input rows for a batch run: JSONL and Parquet readers (a path or ``-`` for stdin).

Every input row becomes a :class:`Row` with its 0-based ``index`` (the request id inside the
engine), its caller-facing ``id``, a ``prompt`` *or* chat ``messages`` and type-checked
per-row sampling overrides. Two kinds of problems are told apart (DESIGN.md "Input and
output"):

* a malformed *file* (invalid JSON or UTF-8, a line that is not an object, an unreadable
  Parquet file, no prompt/messages column) raises :class:`InputError` while reading;
* a bad *row* (missing or empty prompt, both prompt and messages, a wrongly typed sampling
  field) yields a ``Row`` whose ``error`` names the source, line and field, so the caller can
  stop before any model work or, with ``--skip-invalid``, give that row an error result.

Locations: JSONL lines are 1-based physical line numbers (blank lines counted, so an editor's
"go to line" finds them, while ``Row.index`` skips them); Parquet rows are 0-based row numbers
and are called "row" in messages (``data.parquet row 0: ...``). A row of the OpenAI Batch API
format (``{"custom_id": ..., "body": {"messages": ...}}``) is read too: ``custom_id`` is the id
and the fields come from ``body`` (``max_completion_tokens`` is taken for ``max_tokens``).

Reading is lazy: JSONL line by line, Parquet one record batch at a time, so the engine can pull
rows while its prompt-token budget allows (STYLE.md §15).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n")
STDIN = "-"
STDIN_NAME = "<stdin>"
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonlines", ".json")
PARQUET_EXTENSIONS = (".parquet", ".pq")
FORMATS = ("jsonl", "parquet")
_PARQUET_BATCH_ROWS = 1024
_MAX_SHOWN = 60  # characters of an offending value quoted in a message


class InputError(ValueError):
    """A problem with the input file itself (the run cannot read on past it).

    ``str(error)`` is the full message, e.g. ``prompts.jsonl line 7: invalid JSON (Expecting
    value at column 1)`` or ``data.parquet row 3: ...``.

    Attributes:
        source: The file name as given, or ``"<stdin>"``.
        line: 1-based physical line for JSONL; 0-based row number for Parquet; None when the
            problem is with the whole file.
        field: The offending field or column, or None.
        detail: The message without the location prefix.
    """

    def __init__(self, detail: str, *, source: str, line: int | None = None,
                 field: str | None = None, unit: str = "line") -> None:
        super().__init__(f"{_where(source, line, unit)}: {detail}")
        self.source = source
        self.line = line
        self.field = field
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Row:
    """One input row, validated.

    Attributes:
        index: 0-based position among the input's rows (blank JSONL lines skipped).
        id: The row's id field (str or int); defaults to ``index``.
        prompt: Text prompt, or None when ``messages`` is given.
        messages: Chat messages (``[{"role": str, "content": str, ...}]``, null keys dropped),
            or None when ``prompt`` is given.
        params: Per-row sampling overrides, only the fields the row sets (nulls are absent):
            ints for ``max_tokens`` (>= 0), ``top_k`` (>= 0; -1 is read as 0), ``seed``
            (>= 0), ``n`` (>= 1); floats for ``temperature`` (>= 0), ``top_p`` (in (0, 1]),
            ``min_p`` (in [0, 1]); ``stop`` a list of non-empty strings (a string becomes a
            one-element list). Integral floats such as ``10.0`` are accepted as ints.
        error: Why the row cannot run (the full message with source, line and field), or None.
            When set, ``prompt``, ``messages`` and ``params`` hold only what was valid.
        line: Where the row came from: 1-based line (JSONL) or 0-based row (Parquet).
    """

    index: int
    id: str | int
    prompt: str | None
    messages: list[dict] | None
    params: dict[str, Any]
    error: str | None = None
    line: int | None = None


class _Ctx(NamedTuple):
    source: str  # display name
    unit: str  # "line" or "row"
    prompt_column: str
    messages_column: str
    id_column: str


def read_rows(source: str | os.PathLike, *, fmt: str | None = None,
              prompt_column: str = "prompt", messages_column: str = "messages",
              id_column: str = "id") -> Iterator[Row]:
    """Read and validate input rows lazily.

    Args:
        source: A file path, or ``"-"`` for stdin.
        fmt: ``"jsonl"``, ``"parquet"`` or None to choose by extension (``.parquet``/``.pq``
            is Parquet; ``.jsonl``/``.ndjson``/``.jsonlines``/``.json`` is JSONL; stdin is
            JSONL).
        prompt_column: Field holding the text prompt.
        messages_column: Field holding chat messages.
        id_column: Field holding the row id.

    Returns:
        An iterator of rows in input order. File-level problems surface as ``InputError``
        while iterating; row-level problems as ``Row.error``.

    Raises:
        InputError: At call time, when the file does not exist or its format cannot be told.
        ValueError: When ``fmt`` is not one of ``FORMATS``.
    """
    source = os.fspath(source)
    fmt = input_format(source, fmt)
    name = STDIN_NAME if source == STDIN else source
    if source != STDIN and not os.path.isfile(source):
        raise InputError("no such file", source=name)
    ctx = _Ctx(name, "line" if fmt == "jsonl" else "row", prompt_column, messages_column,
               id_column)
    return _iter_jsonl(source, ctx) if fmt == "jsonl" else _iter_parquet(source, ctx)


def input_format(source: str, fmt: str | None = None) -> str:
    """The input format of ``source``: ``fmt`` if given, else from the extension.

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
    if ext in PARQUET_EXTENSIONS:
        return "parquet"
    if ext in JSONL_EXTENSIONS:
        return "jsonl"
    raise InputError(f"cannot tell the format from the extension {ext or '(none)'!r}; "
                     "use .jsonl or .parquet, or give the format", source=source)


def _iter_jsonl(source: str, ctx: _Ctx) -> Iterator[Row]:
    if source == STDIN:
        # NOTE: read bytes where we can so the encoding is UTF-8 whatever the locale says.
        yield from _rows_from_lines(getattr(sys.stdin, "buffer", sys.stdin), ctx)
    else:
        with open(source, "rb") as f:
            yield from _rows_from_lines(f, ctx)


def _rows_from_lines(lines: Any, ctx: _Ctx) -> Iterator[Row]:
    index = 0
    for lineno, raw in enumerate(lines, 1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"not valid UTF-8 ({e.reason} at byte {e.start + 1})",
                                 source=ctx.source, line=lineno) from None
        if lineno == 1:
            raw = raw.removeprefix("\ufeff")
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InputError(f"invalid JSON ({e.msg} at column {e.colno})",
                             source=ctx.source, line=lineno) from None
        if not isinstance(obj, dict):
            raise InputError(f"expected a JSON object, got {_json_type(obj)}",
                             source=ctx.source, line=lineno)
        yield _parse_row(obj, index, lineno, ctx)
        index += 1


def _iter_parquet(source: str, ctx: _Ctx) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if source == STDIN:
            stream = getattr(sys.stdin, "buffer", sys.stdin)
            pf = pq.ParquetFile(pa.BufferReader(stream.read()))
        else:
            pf = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file ({e})", source=ctx.source) from None
    names = pf.schema_arrow.names
    if ctx.prompt_column not in names and ctx.messages_column not in names:
        raise InputError(f'no column "{ctx.prompt_column}" or "{ctx.messages_column}" '
                         f"(columns: {', '.join(names)})", source=ctx.source,
                         field=ctx.prompt_column)
    wanted = {ctx.prompt_column, ctx.messages_column, ctx.id_column, *SAMPLING_FIELDS,
              "custom_id", "body", "max_completion_tokens"}
    index = 0
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS,
                                 columns=[n for n in names if n in wanted]):
        for obj in batch.to_pylist():
            yield _parse_row(obj, index, index, ctx)
            index += 1


def _parse_row(obj: dict[str, Any], index: int, line: int, ctx: _Ctx) -> Row:
    """Validate one decoded row (a JSON object or a Parquet record; None means absent)."""
    problems: list[str] = []
    fields, prefix, row_id, id_field = obj, "", obj.get(ctx.id_column), ctx.id_column
    if "custom_id" in obj and isinstance(obj.get("body"), dict):  # OpenAI Batch API line
        fields, prefix, row_id, id_field = obj["body"], "body.", obj["custom_id"], "custom_id"
        if fields.get("max_tokens") is None and "max_completion_tokens" in fields:
            fields = {**fields, "max_tokens": fields["max_completion_tokens"]}
    if row_id is None:
        row_id = index
    elif isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        problems.append(_bad(id_field, "a string or an integer", row_id))
        row_id = index
    prompt, messages = _parse_input(fields, prefix, ctx, problems)
    params = _parse_params(fields, prefix, problems)
    error = None
    if problems:
        error = f"{_where(ctx.source, line, ctx.unit)}: {'; '.join(problems)}"
    return Row(index, row_id, prompt, messages, params, error, line)


def _parse_input(fields: dict, prefix: str, ctx: _Ctx,
                 problems: list[str]) -> tuple[str | None, list[dict] | None]:
    pc, mc = prefix + ctx.prompt_column, prefix + ctx.messages_column
    prompt, messages = fields.get(ctx.prompt_column), fields.get(ctx.messages_column)
    if prompt is not None and messages is not None:
        problems.append(f'give field "{pc}" or field "{mc}", not both')
        return None, None
    if prompt is None and messages is None:
        problems.append(f'missing field "{pc}" (or "{mc}")')
        return None, None
    if messages is None:
        if isinstance(prompt, str) and prompt.strip():
            return prompt, None
        problems.append(_bad(pc, "a non-empty string", prompt))
        return None, None
    if not isinstance(messages, list) or not messages:
        problems.append(_bad(mc, 'a non-empty list of {"role", "content"} objects', messages))
        return None, None
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            problems.append(_bad(f"{mc}[{i}]", 'an object with "role" and "content"', m))
            return None, None
        m = {k: v for k, v in m.items() if v is not None}
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                problems.append(_bad(f"{mc}[{i}].{key}", "a string", m.get(key)))
                return None, None
        clean.append(m)
    return None, clean


_INT_MIN = {"max_tokens": 0, "top_k": 0, "seed": 0, "n": 1}
_FLOAT_RANGE = {  # name: (ok, wanted)
    "temperature": (lambda x: x >= 0, "a number >= 0"),
    "top_p": (lambda x: 0 < x <= 1, "a number in (0, 1]"),
    "min_p": (lambda x: 0 <= x <= 1, "a number in [0, 1]"),
}


def _parse_params(fields: dict, prefix: str, problems: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        if name in _INT_MIN:
            v = _as_int(value)
            if name == "top_k" and v == -1:  # vLLM's "disabled"
                v = 0
            if v is None or v < _INT_MIN[name]:
                problems.append(_bad(prefix + name, f"an integer >= {_INT_MIN[name]}", value))
                continue
        elif name in _FLOAT_RANGE:
            ok, wanted = _FLOAT_RANGE[name]
            v = _as_float(value)
            if v is None or not ok(v):
                problems.append(_bad(prefix + name, wanted, value))
                continue
        else:  # stop
            v = [value] if isinstance(value, str) else value
            if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
                problems.append(_bad(prefix + name, "a non-empty string or a list of them",
                                     value))
                continue
        params[name] = v
    return params


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _bad(field: str, wanted: str, value: Any) -> str:
    return f'field "{field}" must be {wanted}, got {_show(value)}'


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _where(source: str, line: int | None, unit: str) -> str:
    return source if line is None else f"{source} {unit} {line}"
