"""Pass 1 of a batch run, before the model loads: what a resumed output already holds, every
row checked (fields, ids, token ids against the vocabulary, chat rows against the template),
the output record format, and a resumed output's partial last row cut.

The local run, ``--ray``, ``mlxpa plan`` and ``mlxpa bench --workload file`` all start here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from rich.console import Console

from mlxpa.batch.options import RunOptions
from mlxpa.batch.prompts import prompt_checker
from mlxpa.batch.source import Source
from mlxpa.data import output_format
from mlxpa.data.records import resolve_output_format
from mlxpa.data.resume import Existing, cut, read_existing
from mlxpa.data.validate import Validation, check, validate
from mlxpa.sampling_params import SamplingParams


class Validated(NamedTuple):
    """What pass 1 found.

    Attributes:
        validation: Problems, duplicate ids, rows already done.
        out_fmt: ``mlxpa`` or ``openai`` records (None without an output).
    """

    validation: Validation
    out_fmt: str | None

    @property
    def num_to_run(self) -> int:
        """Rows not in the output yet (the invalid ones included: they get error rows)."""
        return self.validation.num_rows - self.validation.num_done


def validate_input(src: Source, output: str | None, defaults: SamplingParams, options: RunOptions,
            console: Console | None = None, *, vocab_size: int | None,
            tokenizer: Callable[[], Any] | None, refusal: str | None = None) -> Validated:
    """Read ``src`` once and check every row, before the model loads.

    Args:
        src: The input.
        output: The output path (``-``: stdout), or None when nothing is written (``plan``,
            ``bench``).
        defaults: The run's sampling defaults (each row is checked merged with them).
        options: ``resume``, ``skip_invalid``, ``output_fmt`` and ``show_progress`` apply.
        console: Where the progress lines go (default: stderr).
        vocab_size: Every token id a row or the defaults give must be below it (None: not
            checked).
        tokenizer: Returns the model's tokenizer (or None), called once when a row first
            needs it: chat rows are rendered with the template and a ``choice`` row's labels
            joined to its prompt (:func:`~mlxpa.batch.prompts.prompt_checker`); None: not
            checked.
        refusal: What the command does about invalid rows, for the error (None: ``run``'s
            words).

    Returns:
        What pass 1 found (:class:`Validated`).

    Raises:
        InputError: The input cannot be read, or has invalid rows without ``skip_invalid``.
        ValueError: A default token id outside the vocabulary; an output format that does
            not fit; an existing output that is not an mlxpa output.
    """
    console = console or Console(stderr=True)
    file_fmt = output_format(output) if output is not None else None
    existing = _read_existing(output, file_fmt, console) if options.resume else None
    if options.show_progress:
        console.print(f"Reading {src.name}: checking every row before the model loads ...",
                      markup=False, highlight=False, soft_wrap=True)
    v = validate(src.rows(), source=src.name, unit=src.unit, existing=existing,
                 default_n=defaults.n, defaults=defaults, vocab_size=vocab_size,
                 check_prompt=None if tokenizer is None else prompt_checker(
                     tokenizer, src.inputs.split_special_tokens, defaults.structured_outputs,
                     src.inputs.permute_labels, src.inputs.chat_template))
    if not options.skip_invalid:
        check(v, src.name, refusal)
    if options.show_progress:
        console.print(f"{src.name}: {v.num_rows} rows checked", markup=False, highlight=False)
    if output is None:
        return Validated(v, None)
    out_fmt = resolve_output_format(options.output_fmt, file_fmt,
                                    existing.fmt if existing else None, v.all_openai)
    if v.cut_at is not None:
        cut(output, v.cut_at)
    if options.resume:
        console.print(f"{output}: {v.num_done} row(s) already done, "
                      f"{v.num_rows - v.num_done} to run", markup=False, highlight=False,
                      soft_wrap=True)
    return Validated(v, out_fmt)


def _read_existing(output: str, file_fmt: str, console: Console) -> Existing:
    """What a resumed output holds (a torn last line and error rows removed, and said)."""
    existing = read_existing(output, file_fmt)
    if existing.torn:
        console.print(f"{output}: cut a torn last line (it is run again)", markup=False)
    if existing.retried:
        console.print(f"{output}: removed {existing.retried} error row(s); they run again",
                      markup=False, soft_wrap=True)
    return existing
