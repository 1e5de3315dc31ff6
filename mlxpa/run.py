"""``mlxpa run`` as a library call: rows in, results out (in input order), statistics back.

Data flow (one way)::

    [--resume: read_existing(output)]  ids already written, a torn last line cut
    validate(read_rows(input))          pass 1, before the model loads: problems, duplicates
    LLMEngine(config)                   the model loads
    read_rows(input) -> _feed           pass 2, lazy: tokenize, order by prefix per window
        -> LLMEngine.generate (stops between steps when asked) -> RequestOutputs
        -> result_records -> ResultWriter (reorder buffer; flushed as rows finish)

Memory does not grow with the input: both passes stream, pass 2 reads at most one window of
rows ahead of the engine (the engine pulls while its waiting queue is short), and the reorder
buffer holds at most about two windows. stdin is spooled to a temporary file first, since it
is read twice.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Iterator

from rich.console import Console

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.core.prefix_order import ORDERS
from mlxpa.data import (
    STDIN,
    InputOptions,
    ResultWriter,
    Row,
    input_format,
    output_format,
    read_rows,
    spool_stdin,
)
from mlxpa.data._files import check_output_path
from mlxpa.data.inputs import where
from mlxpa.data.read import LINE_FORMATS
from mlxpa.data.records import resolve_output_format
from mlxpa.data.resume import Existing, cut, read_existing
from mlxpa.data.validate import Validation, check, validate
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import Counters, Stats, summarize
from mlxpa.engine_setup import build_engine
from mlxpa.job import Job, close_in_order, report_written
from mlxpa.progress import RunProgress, summary_table
from mlxpa.prompts import messages_checker, prompt_token_ids
from mlxpa.structured.labels import choice_label_checker

PREFIX_WINDOW = 4096  # rows read, tokenized and ordered by shared prefix at a time


class OptionError(ValueError):
    """A bad option of a run, found before any work (the command line's usage error)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """How :func:`run_file` runs a file: the ``mlxpa run`` options beyond the engine, sampling
    and input settings.

    Attributes:
        output_fmt: ``mlxpa`` rows, ``openai`` Batch output lines (JSONL only), or ``auto``
            (what a resumed output holds, else ``openai`` when every input row is an OpenAI
            Batch line and the output is JSONL, else ``mlxpa``).
        order: ``prefix`` admits each window of ``window`` rows in depth-first order of a
            radix tree over its prompts (rows sharing a prefix run together); ``input`` keeps
            the file order.
        ordered: Write results in input order (else as they finish).
        skip_invalid: Write an error result for each invalid row and run the rest (else any
            invalid row stops the run before the model loads).
        resume: Keep the output's rows, skip their ids, and add the rest; with ``ordered``,
            a run that is not stopped then rewrites the whole output in input order.
        metrics_json: Where to write the final statistics as JSON.
        show_progress: Draw the progress bar and final report.
        window: Rows per prefix-ordering window.

    Raises:
        OptionError: ``order`` is not one of :data:`~mlxpa.core.prefix_order.ORDERS`.
    """

    output_fmt: str = "auto"
    order: str = "prefix"
    ordered: bool = True
    skip_invalid: bool = False
    resume: bool = False
    metrics_json: str | None = None
    show_progress: bool = True
    window: int = PREFIX_WINDOW

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise OptionError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")


def run_file(source: str, output: str, config: EngineConfig, defaults: SamplingParams,
             options: RunOptions | None = None, *, inputs: InputOptions | None = None,
             console: Console | None = None, engine: LLMEngine | None = None,
             should_stop: Callable[[], bool] | None = None) -> Stats:
    """Run every row of ``source`` and write its results to ``output``.

    Args:
        source: Input path, ``datasets`` folder, or ``"-"`` (stdin, spooled to a temp file).
        output: Output path (``.jsonl`` or ``.parquet``) or ``"-"`` (stdout, JSONL).
        config: Engine configuration (used when ``engine`` is None).
        defaults: Sampling parameters for fields a row does not set.
        options: How to run (output format, order, resume, ...); None: the defaults.
        inputs: How to read the input; None: the defaults.
        console: Where progress and the report go (default: stderr).
        engine: A ready engine (tests); None builds one from ``config``.
        should_stop: Polled between engine steps; True stops admitting, drops the requests in
            flight (a resume runs them) and writes every finished row.

    Returns:
        The run's statistics.

    Raises:
        InputError: The input cannot be read, or has invalid rows (without ``skip_invalid``);
            raised before the model loads.
        OptionError: ``--resume`` to stdout, or an output that is the input; raised before
            anything is read.
        ValueError: An output that is a folder or in a folder that does not exist, an output
            format that does not fit, an existing output that is not an mlxpa output; raised
            before the model loads.
        KeyboardInterrupt: ``should_stop`` was already true once the model had loaded (the
            output is left as it was).
    """
    options, inputs = options or RunOptions(), inputs or InputOptions()
    check_targets(source, output, options)
    console = console or Console(stderr=True)
    file_fmt = output_format(output)
    existing = _read_existing(output, file_fmt, options.resume, console)
    fmt = input_format(source, inputs.fmt)
    spooled = source == STDIN and fmt != "hf"
    path = spool_stdin(fmt) if spooled else source
    try:
        src = _Source(path, "<stdin>" if spooled else source, dataclasses.replace(inputs, fmt=fmt))
        vocab = engine.runner.vocab_size if engine is not None else _peek_vocab(config.model)
        tokenizer = functools.cache(lambda: engine.tokenizer if engine is not None
                                    else _peek_tokenizer(config.model))
        chat = messages_checker(tokenizer)
        labels = choice_label_checker(tokenizer, lambda row, tok: prompt_token_ids(
            row, tok, src.inputs.split_special_tokens), defaults.structured)
        v, out_fmt = _validation_pass(src, existing, defaults, output, file_fmt, options,
                                      console, vocab, lambda row: chat(row) or labels(row))
        if v.num_rows == v.num_done:  # nothing to run: no model load
            return _empty_run(output, src.name, v, options, console)
        engine = engine or build_engine(config, src.rows(), v, defaults, console,
                                        options.show_progress)
        _generate(engine, src, v, defaults, out_fmt, output, options, console,
                  should_stop or (lambda: False))
    finally:
        if spooled:
            os.remove(path)
    return _finish(summarize(engine.counters), engine.runner, console, options)


def check_targets(source: str, output: str, options: RunOptions) -> None:
    """Check where a run writes, before anything is read.

    Raises:
        OptionError: ``--resume`` to stdout; an output that is the input file.
        ValueError: An output or ``metrics_json`` that is a folder or whose folder does not
            exist.
    """
    if options.resume and output == STDIN:
        raise OptionError("--resume needs an output file (-o PATH), not stdout")
    if _same_file(source, output):
        raise OptionError(f"the output {output} is the input file; writing it would destroy "
                          "the input")
    for target in (output, options.metrics_json):
        if target is not None and target != STDIN:
            check_output_path(target)


def _same_file(a: str, b: str) -> bool:
    try:
        return a != STDIN and b != STDIN and os.path.samefile(a, b)
    except OSError:
        return False


@dataclasses.dataclass(frozen=True, slots=True)
class _Source:
    """The input as both passes read it (a spooled stdin is a file by now)."""

    path: str
    name: str  # in messages
    inputs: InputOptions  # with the format decided

    @property
    def unit(self) -> str:
        return "line" if self.inputs.fmt in LINE_FORMATS else "row"

    def rows(self) -> Iterator[Row]:
        return read_rows(self.path, self.inputs, name=self.name)


def _read_existing(output: str, file_fmt: str, resume: bool, console: Console) -> Existing:
    """What a resumed output holds (a torn last line and error rows removed, and said)."""
    if not resume:
        return Existing({}, None, None, False)
    existing = read_existing(output, file_fmt)
    if existing.torn:
        console.print(f"{output}: cut a torn last line (it is run again)", markup=False)
    if existing.retried:
        console.print(f"{output}: removed {existing.retried} error row(s); they run again",
                      markup=False, soft_wrap=True)
    return existing


def _validation_pass(src: _Source, existing: Existing, defaults: SamplingParams, output: str,
                     file_fmt: str, options: RunOptions, console: Console,
                     vocab_size: int | None, check_prompt) -> tuple[Validation, str]:
    """Pass 1, before the model loads: every row checked (token ids against ``vocab_size``;
    chat rows against the template; unless ``skip_invalid``, the first problems raise
    :class:`InputError`), the output format
    resolved, then a resumed output's partial last row cut. Returns the validation and the
    output format."""
    if options.show_progress:
        console.print(f"Reading {src.name}: checking every row before the model loads ...",
                      markup=False, highlight=False, soft_wrap=True)
    v = validate(src.rows(), source=src.name, unit=src.unit, existing=existing,
                 default_n=defaults.n, defaults=defaults, vocab_size=vocab_size,
                 check_prompt=check_prompt)
    if not options.skip_invalid:
        check(v, src.name)
    if options.show_progress:
        console.print(f"{src.name}: {v.num_rows} rows checked", markup=False, highlight=False)
    out_fmt = resolve_output_format(options.output_fmt, file_fmt, existing.fmt, v.all_openai)
    if v.cut_at is not None:
        cut(output, v.cut_at)
    if options.resume:
        console.print(f"{output}: {v.num_done} row(s) already done, "
                      f"{v.num_rows - v.num_done} to run", markup=False, highlight=False,
                      soft_wrap=True)
    return v, out_fmt


def _empty_run(output: str, name: str, v: Validation, options: RunOptions,
               console: Console) -> Stats:
    """Nothing to run: an empty output (or the resumed one, in input order), no model load."""
    with ResultWriter(output, ordered=options.ordered, append=options.resume,
                      positions=v.done) as writer:
        close_in_order(writer, output, options.resume and options.ordered, False,
                       options.show_progress, console)
    if options.show_progress and not options.resume:
        console.print(f"{name}: no rows; wrote an empty output", markup=False, soft_wrap=True)
    return _finish(summarize(Counters()), None, console, options)


def _generate(engine: LLMEngine, src: _Source, v: Validation, defaults: SamplingParams,
              out_fmt: str, output: str, options: RunOptions, console: Console,
              should_stop: Callable[[], bool]) -> None:
    """Pass 2: every row to run through the engine, results written as they finish."""
    if should_stop():  # asked before anything was written: leave the output alone
        raise KeyboardInterrupt
    engine.counters.start_time = time.perf_counter()
    # The bar first: with stdout on its terminal, rich redirects stdout above the bar.
    with RunProgress(v.num_rows - v.num_done, engine.counters, console, options.show_progress,
                     output == STDIN) as progress, \
            ResultWriter(output, ordered=options.ordered, append=options.resume,
                         positions=v.done) as writer:
        job = Job(engine, v, defaults, out_fmt, lambda row: where(src.name, row.line, src.unit),
                  writer, progress, src.inputs.split_special_tokens)
        job.run(src.rows(), options.order, options.window, should_stop)
        close_in_order(writer, output, options.resume and options.ordered, should_stop(),
                       options.show_progress, console)
    report_written(engine, writer.num_written, output, should_stop(), options.show_progress,
                   console, job.pending.values())


def _peek_tokenizer(spec: str | None):
    from mlxpa.loader.models import peek_tokenizer

    return peek_tokenizer(spec)


def _peek_vocab(spec: str | None) -> int | None:
    """The model's vocabulary size from its ``config.json`` (None if it cannot be read)."""
    from mlxpa.loader.models import peek_vocab_size

    return peek_vocab_size(spec)


def _finish(stats: Stats, runner, console: Console, options: RunOptions) -> Stats:
    """The final report (``runner``: the pool's and the budget's blocks; None: nothing ran)
    and ``--metrics-json``."""
    if options.show_progress and runner is not None:
        console.print(summary_table(stats, runner.num_blocks - 1, runner.budget_blocks - 1))
    if options.show_progress and stats.failed_rows:
        console.print(f"warning: {stats.failed_rows} row(s) failed; their output rows "
                      "carry an error field", style="yellow", highlight=False, soft_wrap=True)
    if options.metrics_json:
        with open(options.metrics_json, "w") as f:
            json.dump(stats.to_dict(), f, indent=2)
    return stats
