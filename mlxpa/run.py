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
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.core.prefix_order import prefix_order
from mlxpa.data import (
    STDIN,
    InputOptions,
    ResultWriter,
    Row,
    input_format,
    output_format,
    spool_stdin,
)
from mlxpa.data.records import error_records, resolve_output_format, result_records
from mlxpa.data.resume import Existing, cut, id_key, read_existing
from mlxpa.data.rows import where
from mlxpa.data.validate import Validation, check, validate
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.engine.metrics import Counters, Stats, summarize
from mlxpa.progress import RunProgress, summary_table
from mlxpa.prompts import prompt_token_ids
from mlxpa.request import RequestOutput

PREFIX_WINDOW = 4096  # rows read, tokenized and ordered by shared prefix at a time


def run_file(source: str, output: str, config: EngineConfig, defaults: SamplingParams, *,
             inputs: InputOptions | None = None, output_fmt: str = "auto",
             order: str = "prefix", ordered: bool = True, skip_invalid: bool = False,
             resume: bool = False, metrics_json: str | None = None,
             console: Console | None = None, show_progress: bool = True,
             engine: LLMEngine | None = None, should_stop: Callable[[], bool] | None = None,
             window: int = PREFIX_WINDOW) -> Stats:
    """Run every row of ``source`` and write its results to ``output``.

    Args:
        source: Input path, ``datasets`` folder, or ``"-"`` (stdin, spooled to a temp file).
        output: Output path (``.jsonl`` or ``.parquet``) or ``"-"`` (stdout, JSONL).
        config: Engine configuration (used when ``engine`` is None).
        defaults: Sampling parameters for fields a row does not set.
        inputs: How to read the input (None: the defaults).
        output_fmt: ``mlxpa`` rows, ``openai`` Batch output lines (JSONL only), or ``auto``
            (what a resumed output holds, else ``openai`` when every input row is an OpenAI
            Batch line and the output is JSONL, else ``mlxpa``).
        order: ``prefix`` admits each window of ``window`` rows in depth-first order of a
            radix tree over its prompts (rows sharing a prefix run together); ``input`` keeps
            the file order.
        ordered: Write results in input order (else as they finish).
        skip_invalid: Write an error result for each invalid row and run the rest (else any
            invalid row stops the run before the model loads).
        resume: Keep the output's rows, skip their ids, and add the rest.
        metrics_json: Where to write the final statistics as JSON.
        console: Where progress and the report go (default: stderr).
        show_progress: Draw the progress bar and final report.
        engine: A ready engine (tests); None builds one from ``config``.
        should_stop: Polled between engine steps; True stops admitting, drops the requests in
            flight (a resume runs them) and writes every finished row.
        window: Rows per prefix-ordering window.

    Returns:
        The run's statistics.

    Raises:
        InputError: The input cannot be read, or has invalid rows (without ``skip_invalid``);
            raised before the model loads.
        ValueError: A bad option (an output format that does not fit, ``--resume`` to stdout,
            an output folder that does not exist, an existing output that is not an mlxpa
            output); raised before the model loads.
        KeyboardInterrupt: ``should_stop`` was already true once the model had loaded (the
            output is left as it was).
    """
    if order not in ("prefix", "input"):
        raise ValueError(f"order must be 'prefix' or 'input', got {order!r}")
    file_fmt = output_format(output)
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
    console = console or Console(stderr=True)
    inputs = inputs or InputOptions()
    existing = read_existing(output, file_fmt) if resume else Existing({}, None, None, False)
    if existing.torn:
        console.print(f"{output}: cut a torn last line (it is run again)", markup=False)
    if existing.retried:
        console.print(f"{output}: removed {existing.retried} error row(s); they run again",
                      markup=False, soft_wrap=True)
    fmt = input_format(source, inputs.fmt)
    spooled = source == STDIN and fmt != "hf"
    path = spool_stdin(fmt) if spooled else source
    try:
        name = "<stdin>" if spooled else source

        def rows() -> Iterator[Row]:
            return inputs.read(path, fmt, name)

        unit = "line" if fmt in ("jsonl", "csv") else "row"
        vocab = engine.runner.vocab_size if engine is not None else _peek_vocab(config.model)
        v = validate(rows(), source=name, unit=unit, existing=existing, default_n=defaults.n,
                     defaults=defaults, vocab_size=vocab)
        if not skip_invalid:
            check(v, name)
        out_fmt = resolve_output_format(output_fmt, file_fmt, existing.fmt, v.all_openai)
        if v.cut_at is not None:
            cut(output, v.cut_at)
        if resume:
            console.print(f"{output}: {v.num_done} row(s) already done, "
                          f"{v.num_rows - v.num_done} to run", markup=False, highlight=False,
                          soft_wrap=True)
        if v.num_rows == v.num_done:  # nothing to run: no model load
            with ResultWriter(output, ordered=ordered, append=resume):
                pass
            if show_progress and not resume:
                console.print(f"{name}: no rows; wrote an empty output", markup=False,
                              soft_wrap=True)
            return _finish(summarize(Counters()), None, console, show_progress, metrics_json)
        should_stop = should_stop or (lambda: False)
        engine = engine or LLMEngine(config)
        if should_stop():  # asked before anything was written: leave the output alone
            raise KeyboardInterrupt
        engine.counters.start_time = time.perf_counter()
        with ResultWriter(output, ordered=ordered, append=resume) as writer, RunProgress(
                v.num_rows - v.num_done, engine.counters, console, show_progress) as progress:
            job = _Job(engine, v, defaults, out_fmt, lambda row: where(name, row.line, unit),
                       writer, progress, inputs.split_special_tokens)
            job.run(rows(), order, window, should_stop)
    finally:
        if spooled:
            os.remove(path)
    return _finish(summarize(engine.counters), engine.runner.num_blocks - 1, console,
                   show_progress, metrics_json)


def _finish(stats: Stats, num_blocks: int | None, console: Console, show_progress: bool,
            metrics_json: str | None) -> Stats:
    """The final report and ``--metrics-json``."""
    if show_progress and num_blocks is not None:
        console.print(summary_table(stats, num_blocks))
    if show_progress and stats.failed_rows:
        console.print(f"warning: {stats.failed_rows} row(s) failed; their output rows "
                      "carry an error field", style="yellow", highlight=False, soft_wrap=True)
    if metrics_json:
        with open(metrics_json, "w") as f:
            json.dump(stats.to_dict(), f, indent=2)
    return stats


@dataclasses.dataclass(slots=True)
class _Job:
    """Pass 2: rows to requests, engine outputs to result records, for one writer."""

    engine: LLMEngine
    validation: Validation
    defaults: SamplingParams
    out_fmt: str
    place: Callable[[Row], str]  # "file line 3" for run-time errors
    writer: ResultWriter
    progress: RunProgress
    split_special_tokens: bool = False  # control-token text in prompts is ordinary text
    in_flight: dict[int, Row] = dataclasses.field(default_factory=dict)
    unshown: int = 0  # rows done since the progress bar was last advanced
    shown_at: float = 0.0

    def run(self, rows: Iterable[Row], order: str, window: int,
            should_stop: Callable[[], bool]) -> None:
        model = _model_name(self.engine.config.model)
        samples: dict[int, list[RequestOutput]] = {}
        items = _windows(self._feed(rows), order, self.engine.config.block_size, window)
        for out in self.engine.generate(items, should_stop=should_stop):
            group = samples.setdefault(out.request_id, [])
            group.append(out)
            row = self.in_flight[out.request_id]
            if len(group) == row.params.get("n", self.defaults.n):
                del samples[row.index], self.in_flight[row.index]
                if any(o.error for o in group):
                    self.engine.counters.failed_rows += 1
                group.sort(key=lambda o: o.sample_index)
                self.writer.add(row.index, result_records(row, group, self.out_fmt, model,
                                                          self.place(row)))
                self._advance()
        self.progress.advance(self.unshown)

    def _advance(self) -> None:
        # NOTE: RunProgress.advance summarizes all counters (percentiles over every TTFT), so
        # it runs at most 10 times a second, not once a row (that was quadratic in rows).
        self.unshown += 1
        now = time.monotonic()
        if now - self.shown_at >= 0.1:
            self.progress.advance(self.unshown)
            self.unshown, self.shown_at = 0, now

    def _feed(self, rows: Iterable[Row]) -> Iterator[PromptInput | None]:
        """A request for each row left to run, in input order, and None for a row dealt
        with here: already in the output (skipped) or unable to run (its error written)."""
        for row in rows:
            if row.id is not None and id_key(row.id) in self.validation.done:
                self.writer.skip(row.index)
                yield None
                continue
            error = row.error or self.validation.row_problems.get(row.index)
            if error is None:
                try:
                    params = dataclasses.replace(self.defaults, **row.params)
                    ids = prompt_token_ids(row, self.engine.tokenizer,
                                           self.split_special_tokens)
                except ValueError as e:
                    error = f"{self.place(row)}: {e}"
            if error is not None:
                self.engine.counters.failed_rows += 1
                self.writer.add(row.index, error_records(row, error, self.out_fmt))
                self._advance()
                yield None
                continue
            self.in_flight[row.index] = row
            yield PromptInput(row.index, ids, params)


def _windows(items: Iterable[PromptInput | None], order: str, block_size: int,
             window: int) -> Iterator[PromptInput]:
    """The requests of ``items``: in input order, or (``prefix``) by windows of ``window``
    rows (Nones count, so rows read ahead of the engine stay bounded), each window in
    depth-first order of its prompts' prefix tree."""
    if order == "input":
        yield from (it for it in items if it is not None)
        return
    batch: list[PromptInput] = []
    num_read = 0
    for item in items:
        num_read += 1
        if item is not None:
            batch.append(item)
        if num_read >= window:
            yield from (batch[i] for i in prefix_order([b.prompt_token_ids for b in batch],
                                                       block_size))
            batch, num_read = [], 0
    yield from (batch[i] for i in prefix_order([b.prompt_token_ids for b in batch], block_size))


def _peek_vocab(spec: str | None) -> int | None:
    from mlxpa.loader.models import peek_vocab_size

    return peek_vocab_size(spec)


def _model_name(spec: str | None) -> str:
    from mlxpa.loader.models import DEFAULT_MODEL_NAME

    return os.path.basename(os.path.normpath(spec)) if spec else DEFAULT_MODEL_NAME
