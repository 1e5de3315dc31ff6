"""The driver's pass 1 of a Ray run, as in a local run: ``--resume``, the validation pass
(file, line and field of every problem) and the output record format.

The driver reads the input with mlxpa's own readers rather than ``ray.data.read_json`` /
``read_parquet`` / ``read_csv``: Ray's readers drop what mlxpa promises per row (1-based line
numbers in messages, an ``error`` row for a line that is not JSON or not UTF-8 instead of a
failed read, duplicate ids across the whole file, OpenAI Batch lines, ``--resume`` skips), so
rows are validated here and reach Ray through ``ray.data.from_items`` in shards.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import NamedTuple

from rich.console import Console

from mlxpa.batch.run import RunOptions
from mlxpa.config import SamplingParams
from mlxpa.data import (
    STDIN,
    InputOptions,
    Row,
    input_format,
    output_format,
    read_rows,
    spool_stdin,
)
from mlxpa.data.records import resolve_output_format
from mlxpa.data.resume import Existing, cut, read_existing
from mlxpa.data.validate import Validation, check, validate


class Prepared(NamedTuple):
    """What pass 1 found.

    Attributes:
        path: The file to read (a spooled copy of stdin when ``spooled``).
        name: The input's display name.
        inputs: The reader settings, with the input format decided.
        unit: ``line`` or ``row``.
        spooled: ``path`` is a temporary file (the caller removes it).
        validation: Problems, duplicates and rows already done.
        out_fmt: ``mlxpa`` or ``openai`` records.
    """

    path: str
    name: str
    inputs: InputOptions
    unit: str
    spooled: bool
    validation: Validation
    out_fmt: str

    def rows(self) -> Iterator[Row]:
        """The input's rows, read again (pass 2)."""
        return read_rows(self.path, self.inputs, name=self.name)


def prepare(source: str, output: str, defaults: SamplingParams, inputs: InputOptions,
            options: RunOptions, console: Console) -> Prepared:
    """Pass 1 (nothing loads a model): read ``source`` once and validate every row.

    Raises:
        InputError: Unreadable input, or invalid rows without ``skip_invalid``.
        ValueError: An output format that does not fit, or an output that is not mlxpa's.
    """
    resume = options.resume
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
    inputs = dataclasses.replace(inputs, fmt=fmt)
    try:
        v = validate(read_rows(path, inputs, name=name), source=name, unit=unit,
                     existing=existing, default_n=defaults.n, defaults=defaults)
        if not options.skip_invalid:
            check(v, name)
        out_fmt = resolve_output_format(options.output_fmt, file_fmt, existing.fmt,
                                        v.all_openai)
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
    return Prepared(path, name, inputs, unit, spooled, v, out_fmt)
