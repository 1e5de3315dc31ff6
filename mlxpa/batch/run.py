"""``mlxpa run`` as a library call: rows in, results out (in input order), statistics back.

Data flow (one way)::

    Source.open(input)                  stdin spooled to a temporary file (read twice)
    validate_input(source)              pass 1, before the model loads: --resume, problems,
                                        duplicates, token ids, chat templates
    rows_to_requests(source) -> windows pass 2, lazy: rows to requests (to_request: the
                                        input processor), in windows of rows
    build_engine(first window)          the model loads; the KV pool is sized to the first
                                        window's requests (the budget when more rows follow)
    Job: rows that cannot run written as each window is read; RequestStream (each window in
        prefix order -> LLMEngine.generate, stops between steps when asked; a row's samples
        grouped) -> result_records -> ResultWriter (reorder buffer; flushed as rows finish)
    final_report

When the first window is the whole input and none of its rows can run (each invalid, over the
context, or already in the output), the model never loads.

Memory does not grow with the input: both passes stream, pass 2 reads at most one window of
rows ahead of the engine (the engine pulls while its waiting queue is short), and the reorder
buffer holds at most about two windows.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable

from rich.console import Console

from mlxpa.annotation.tally import AnswerTally
from mlxpa.batch.job import Job, close_in_order, report_written, write_unrunnable
from mlxpa.batch.model_meta import ModelMeta
from mlxpa.batch.options import OptionError, RunOptions, check_targets
from mlxpa.batch.report import final_report
from mlxpa.batch.requests import RowRequest, rows_to_requests
from mlxpa.batch.setup import build_engine
from mlxpa.batch.source import Source
from mlxpa.batch.validation import Validated, validate_input
from mlxpa.config import EngineConfig
from mlxpa.data import STDIN, InputOptions, ResultWriter
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import Counters, Stats, summarize
from mlxpa.engine.progress import RunProgress
from mlxpa.engine.stream import windows
from mlxpa.sampling_params import SamplingParams

__all__ = ["OptionError", "RunOptions", "run_file"]


def run_file(source: str, output: str, config: EngineConfig, defaults: SamplingParams,
             options: RunOptions | None = None, *, inputs: InputOptions | None = None,
             console: Console | None = None, engine: LLMEngine | None = None,
             should_stop: Callable[[], bool] | None = None,
             answers: AnswerTally | None = None, validated: Validated | None = None) -> Stats:
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
        answers: Counts the answers of rows asked questions (the report's gold figures and
            label order check); None: a fresh one.
        validated: Pass 1's result when the caller ran it already (``mlxpa calibrate``, with
            ``output``); None: run here.

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
    model = ModelMeta(config, engine)
    with Source.open(source, inputs) as src:
        p = validated or validate_input(src, output, defaults, options, console,
                                        vocab_size=model.vocab_size(),
                                        tokenizer=model.tokenizer_or_none)
        if p.num_to_run == 0:  # nothing to run: no model load
            return _without_model(output, src.name, p, [], options, console)
        fed = windows(rows_to_requests(src, p.validation, defaults,
                                       model.input_processor(src.inputs)), options.window)
        first = next(fed, [])
        requests = [rr.request for rr in first if rr.request is not None]
        more = len(first) < p.validation.num_rows
        if engine is None and not requests and not more:  # every row failed before the load
            return _without_model(output, src.name, p, first, options, console)
        engine = engine or build_engine(
            config, requests, more, constrained=p.validation.constrained, console=console,
            verbose=options.show_progress, tokenizer=model.tokenizer())
        tally = answers or AnswerTally(
            options.calibration.error_budget if options.calibration else 0.05,
            inputs.gold_column)
        _generate(engine, src, p, output, options, console,
                  should_stop or (lambda: False), itertools.chain([first], fed), tally)
    engine.write_back()  # the disk KV tier keeps what this run's rows shared
    r = engine.runner
    stats = summarize(engine.counters)
    final_report(stats, console, options, kv_blocks=(r.num_blocks - 1, r.budget_blocks - 1),
                 answers=tally)
    return stats


def _without_model(output: str, name: str, p: Validated, window: list[RowRequest],
                   options: RunOptions, console: Console) -> Stats:
    """Nothing for the model to run: the rows of ``window`` (the whole input) written as
    error rows or skipped, the output put in input order; no model load."""
    counters = Counters()
    with ResultWriter(output, ordered=options.ordered, append=options.resume,
                      positions=p.validation.done) as writer:
        write_unrunnable(window, writer, p.out_fmt, counters)
        close_in_order(writer, output, options.resume and options.ordered, False,
                       options.show_progress, console)
    if options.show_progress and not window and not options.resume:
        console.print(f"{name}: no rows; wrote an empty output", markup=False, soft_wrap=True)
    elif options.show_progress and counters.failed_rows and output != STDIN:
        console.print(f"wrote {writer.num_written} row(s) to {output}", markup=False,
                      highlight=False)
    stats = summarize(counters)
    final_report(stats, console, options, table=False)
    return stats


def _generate(engine: LLMEngine, src: Source, p: Validated, output: str, options: RunOptions,
              console: Console, should_stop: Callable[[], bool],
              fed: Iterable[list[RowRequest]], tally: AnswerTally) -> None:
    """Pass 2: every row to run through the engine, results written as they finish (the
    answers of rows asked questions counted in ``tally``)."""
    if should_stop():  # asked before anything was written: leave the output alone
        raise KeyboardInterrupt
    engine.counters.start_time = time.perf_counter()
    # The bar first: with stdout on its terminal, rich redirects stdout above the bar.
    with RunProgress(p.num_to_run, engine.counters, console, options.show_progress,
                     output == STDIN) as progress, \
            ResultWriter(output, ordered=options.ordered, append=options.resume,
                         positions=p.validation.done) as writer:
        job = Job(engine, p.out_fmt, src.place, writer, progress,
                  calibration=options.calibration, permute=src.inputs.permute_labels,
                  tally=tally)
        job.run(fed, options.order, should_stop)
        close_in_order(writer, output, options.resume and options.ordered, should_stop(),
                       options.show_progress, console)
    report_written(engine, writer.num_written, output, should_stop(), options.show_progress,
                   console, job.pending.values(), named=options.name_output)
