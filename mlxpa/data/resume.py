"""``--resume``: what an existing output already holds, so a rerun skips those rows.

A JSONL output is scanned line by line: a torn last line (no final newline) is cut off, error
records are removed (the input may have been fixed since), and each other line counts for its
``id`` (an OpenAI line's ``custom_id`` stands for its whole row). A row whose ``n`` samples were
only partly written (only the last row can be) is cut off too and run again (:func:`cut`).

A Parquet output counts the ids of the complete file and of the finished row groups an
interrupted run left in its parts folder (:func:`~mlxpa.data.parquet.iter_parquet_ids`); a row's
samples never straddle two row groups, and its error rows count as done. Ids are compared as
text (``7`` and ``"7"`` are the same id), as a Parquet ``id`` column turns int ids into strings
once a string id appears.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from mlxpa.data._files import atomic_rewrite
from mlxpa.data.schema import id_key

COMPLETE = 1 << 30  # the count of a row that is done whatever its n (an OpenAI line)


class Tail(NamedTuple):
    """The last run of JSONL lines with one id: its key, byte offset and number of lines."""

    key: str
    offset: int
    count: int


class Existing(NamedTuple):
    """What an output already holds.

    Attributes:
        counts: Records per id key (``COMPLETE`` for a row that is done whatever its n).
        fmt: ``"openai"`` or ``"mlxpa"`` (the first record's shape), None when empty.
        tail: JSONL only: the last run of lines with one id, else None.
        torn: A torn last line was cut off.
        retried: Error records removed from a JSONL output (their rows run again).
    """

    counts: dict[str, int]
    fmt: str | None
    tail: Tail | None
    torn: bool
    retried: int = 0


def read_existing(path: str, file_fmt: str) -> Existing:
    """Scan the output at ``path`` (``file_fmt`` ``jsonl`` or ``parquet``); nothing there is
    an empty :class:`Existing`.

    Raises:
        ValueError: A complete JSONL line is not a JSON object with an id (the file is not an
            mlxpa output; it is left as it is).
        OSError: The Parquet output cannot be read.
    """
    if file_fmt == "parquet":
        from mlxpa.data.parquet import iter_parquet_ids

        counts: dict[str, int] = {}
        for value in iter_parquet_ids(path):
            key = id_key(value)
            counts[key] = counts.get(key, 0) + 1
        return Existing(counts, "mlxpa" if counts else None, None, False)
    if not os.path.isfile(path):
        return Existing({}, None, None, False)
    return _scan_jsonl(path)


def cut(path: str, offset: int) -> None:
    """Truncate the file at ``path`` to ``offset`` bytes."""
    with open(path, "r+b") as f:
        f.truncate(offset)


def _scan_jsonl(path: str) -> Existing:
    counts: dict[str, int] = {}
    fmt = tail = None
    torn = False
    offset = errors = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                torn = True
                offset = start
                break
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            openai = isinstance(obj, dict) and "custom_id" in obj and "response" in obj
            if not isinstance(obj, dict) or not (openai or "id" in obj):
                raise ValueError(f"{path} line {lineno}: not an mlxpa result line; cannot "
                                 "resume into this file")
            fmt = fmt or ("openai" if openai else "mlxpa")
            if obj.get("error") is not None:
                errors += 1
                continue
            key = id_key(obj["custom_id"] if openai else obj["id"])
            counts[key] = COMPLETE if openai else counts.get(key, 0) + 1
            if tail is not None and tail.key == key:
                tail = tail._replace(count=tail.count + 1)
            else:
                tail = Tail(key, start, 1)
    if torn:
        cut(path, offset)
    if errors:
        _drop_error_lines(path)
        return _scan_jsonl(path)._replace(torn=torn, retried=errors)
    return Existing(counts, fmt, tail, torn)


def _drop_error_lines(path: str) -> None:
    """Rewrite the JSONL file at ``path`` without its error records (atomically)."""
    with atomic_rewrite(path) as tmp, open(path, "rb") as src, open(tmp, "wb") as dst:
        for raw in src:
            if raw.strip() and json.loads(raw).get("error") is not None:
                continue
            dst.write(raw)


def resume_hint(source: str, output: str, argv: list[str]) -> str:
    """What to print after an interrupted run: the exact command that resumes it.

    Args:
        source: The input as given.
        output: The output as given.
        argv: ``sys.argv`` (used when it is an ``mlxpa run`` command line).
    """
    import shlex

    if output == "-":
        return "interrupted: the rows finished so far are on stdout (no --resume for stdout)"
    from mlxpa.data.parquet import parts_dir

    if not os.path.exists(output) and not os.path.isdir(parts_dir(output)):
        return f"interrupted before any row finished; nothing was written to {output}"
    if len(argv) > 1 and argv[1] == "run":
        args = argv[2:] + ([] if "--resume" in argv else ["--resume"])
        command = shlex.join(["mlxpa", "run", *args])
    else:  # a library or test caller: the same options, written out by hand
        command = (f"mlxpa run {shlex.quote(source)} -o {shlex.quote(output)} [same options] "
                   "--resume")
    stdin = " (with the same input on stdin)" if source == "-" else ""
    return f"interrupted: finished rows are in {output}; to run the rest{stdin}:\n  {command}"
