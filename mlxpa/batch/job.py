"""Pass 2 of a file run (:func:`mlxpa.batch.run.run_file`): the windows of
:func:`~mlxpa.batch.requests.feed` through the streaming core
(:class:`~mlxpa.batch.stream.RowStream`: each window in prefix order), each finished row's
samples to result records in the writer, rows that cannot run to error records, rows already
done skipped."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from rich.console import Console

from mlxpa.batch.progress import RunProgress
from mlxpa.batch.report import model_name
from mlxpa.batch.requests import Fed
from mlxpa.batch.stream import RowStream
from mlxpa.data import STDIN, ResultWriter, Row
from mlxpa.data.records import error_records, result_records
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import Counters
from mlxpa.request import SampleOutput


@dataclasses.dataclass(slots=True)
class Job:
    """Pass 2: the rows through the engine, their results and error rows to the writer."""

    engine: LLMEngine
    out_fmt: str
    place: Callable[[Row], str]  # "file line 3" for run-time errors
    writer: ResultWriter
    progress: RunProgress
    # finished samples of rows whose other samples still run (a row is written whole)
    pending: dict[int, list[SampleOutput]] = dataclasses.field(default_factory=dict)

    def run(self, windows: Iterable[list[Fed]], order: str,
            should_stop: Callable[[], bool]) -> None:
        model = model_name(self.engine.config.model)
        stream = RowStream(self.engine, order, pending=self.pending)
        for fed, outs in stream.run(windows, should_stop):
            if not outs:
                settle_row(fed, self.writer, self.out_fmt, self.engine.counters)
                self.progress.advance(int(fed.error is not None))
                continue
            if any(o.error for o in outs):
                self.engine.counters.failed_rows += 1
            self.writer.add(fed.row.index, result_records(
                fed.row, outs, self.out_fmt, model, self.place(fed.row), self.engine.tokenizer))
            self.progress.advance()


def settle(window: list[Fed], writer: ResultWriter, out_fmt: str,
           counters: Counters) -> list[Fed]:
    """:func:`settle_row` for each row of ``window``; returns the rows that run, in input
    order."""
    return [fed for fed in window if settle_row(fed, writer, out_fmt, counters)]


def settle_row(fed: Fed, writer: ResultWriter, out_fmt: str, counters: Counters) -> bool:
    """Write the error row of ``fed`` if it cannot run (counted in ``counters.failed_rows``)
    or skip it if the output already holds it; returns whether it runs."""
    if fed.request is not None:
        return True
    if fed.error is not None:
        counters.failed_rows += 1
        writer.add(fed.row.index, error_records(fed.row, fed.error, out_fmt))
    else:
        writer.skip(fed.row.index)
    return False


def close_in_order(writer: ResultWriter, output: str, resumed_in_order: bool, stopped: bool,
                   verbose: bool, console: Console) -> None:
    """Close the writer of a run; a resumed ordered run (``resumed_in_order``) that was not
    stopped puts the whole output in input order, and says so first (a stopped one leaves
    that to the next resume)."""
    if resumed_in_order and not stopped and verbose:
        console.print(f"{output}: putting every row in input order ...", markup=False,
                      highlight=False, soft_wrap=True)
    writer.close(reorder=not stopped)


def report_written(engine: LLMEngine, written: int, output: str, interrupted: bool,
                   verbose: bool, console: Console,
                   pending: Iterable[list[SampleOutput]] = ()) -> None:
    """Say where the rows went; after an interrupt, take the requests in flight and the
    finished samples of rows not written (``pending``; a resume runs both) out of the
    counters, so the report counts what was written, and say what was dropped."""
    if interrupted:
        done = [o for group in pending for o in group]
        dropped = [*engine.scheduler.running, *engine.scheduler.waiting, *done]
        lost = sum(r.num_prompt_tokens for r in dropped if r.sample_index == 0)
        engine.counters.prompt_tokens -= lost
        engine.counters.requests -= len(done)
        engine.counters.generation_tokens -= (
            sum(len(o.token_ids) for o in done)
            + sum(r.num_output_tokens for r in (*engine.scheduler.running,
                                                 *engine.scheduler.waiting)))
        if verbose:
            console.print(f"interrupted: dropped {len(dropped)} request(s) in flight ({lost} "
                          "prompt tokens; --resume runs them); the report counts the "
                          "finished rows", markup=False, highlight=False)
    if verbose and output != STDIN:
        console.print(f"wrote {written} row(s) to {output}", markup=False, highlight=False)
