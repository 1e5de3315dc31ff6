"""The driver's pass 1 of a Ray run, as in a local run: output checks, ``--resume``, the
validation pass (file, line and field of every problem) and the output record format.

The driver reads the input with mlxpa's own readers rather than ``ray.data.read_json`` /
``read_parquet`` / ``read_csv``: Ray's readers drop what mlxpa promises per row (1-based line
numbers in messages, an ``error`` row for a line that is not JSON or not UTF-8 instead of a
failed read, duplicate ids across the whole file, OpenAI Batch lines, ``--resume`` skips), so
rows are validated here and reach Ray through ``ray.data.from_items`` in shards.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from rich.console import Console

from mlxpa.config import SamplingParams
from mlxpa.data import STDIN, InputOptions, input_format, output_format, spool_stdin
from mlxpa.data.records import resolve_output_format
from mlxpa.data.resume import Existing, cut, read_existing
from mlxpa.data.validate import Validation, check, validate


class Prepared(NamedTuple):
    """What pass 1 found.

    Attributes:
        path: The file to read (a spooled copy of stdin when ``spooled``).
        name: The input's display name.
        fmt: Input format.
        unit: ``line`` or ``row``.
        spooled: ``path`` is a temporary file (the caller removes it).
        validation: Problems, duplicates and rows already done.
        out_fmt: ``mlxpa`` or ``openai`` records.
    """

    path: str
    name: str
    fmt: str
    unit: str
    spooled: bool
    validation: Validation
    out_fmt: str


def check_targets(output: str, metrics_json: str | None, resume: bool) -> None:
    """Raise ValueError for an output or metrics path that cannot be written (a folder, a
    missing parent folder), or ``resume`` to stdout."""
    if resume and output == STDIN:
        raise ValueError("--resume needs an output file (-o PATH), not stdout")
    for target in (output, metrics_json):
        if target is None or target == STDIN:
            continue
        if os.path.isdir(target):
            raise ValueError(f"{target} is a folder; give a file path")
        folder = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(folder):
            raise ValueError(f"{target}: the output folder {folder} does not exist")


def prepare(source: str, output: str, defaults: SamplingParams, inputs: InputOptions,
            output_fmt: str, skip_invalid: bool, resume: bool, console: Console) -> Prepared:
    """Pass 1 (nothing loads a model): read ``source`` once and validate every row.

    Raises:
        InputError: Unreadable input, or invalid rows without ``skip_invalid``.
        ValueError: An output format that does not fit, or an output that is not mlxpa's.
    """
    file_fmt = output_format(output)
    existing = read_existing(output, file_fmt) if resume else Existing({}, None, None, False)
    if existing.torn:
        console.print(f"{output}: cut a torn last line (it is run again)", markup=False)
    if existing.retried:
        console.print(f"{output}: removed {existing.retried} error row(s); they run again",
                      markup=False, soft_wrap=True)
    fmt = input_format(source, inputs.fmt)
    spooled = source == STDIN and fmt != "hf"
    path = spool_stdin(fmt) if spooled else source
    name = "<stdin>" if spooled else source
    unit = "line" if fmt in ("jsonl", "csv") else "row"
    try:
        v = validate(inputs.read(path, fmt, name), source=name, unit=unit, existing=existing,
                     default_n=defaults.n, defaults=defaults)
        if not skip_invalid:
            check(v, name)
        out_fmt = resolve_output_format(output_fmt, file_fmt, existing.fmt, v.all_openai)
    except BaseException:
        if spooled:
            os.remove(path)
        raise
    if v.cut_at is not None:
        cut(output, v.cut_at)
    if resume:
        console.print(f"{output}: {v.num_done} row(s) already done, "
                      f"{v.num_rows - v.num_done} to run", markup=False, highlight=False,
                      soft_wrap=True)
    return Prepared(path, name, fmt, unit, spooled, v, out_fmt)
