"""Pass 2 of a file run (:func:`mlxpa.batch.run.run_file`): the windows of
:func:`~mlxpa.batch.requests.rows_to_requests` through the streaming core
(:class:`~mlxpa.engine.stream.RequestStream`: each window in prefix order), each finished row's
samples to result records in the writer. Rows that cannot run stay on this side: as each
window is read, they are written as error records, or skipped when already done
(:func:`write_unrunnable`), and only the others reach the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console

from mlxpa.annotation.calibration import Calibration
from mlxpa.annotation.tally import AnswerTally
from mlxpa.batch.report import model_name
from mlxpa.batch.requests import RowRequest
from mlxpa.data import STDIN, ResultWriter, Row
from mlxpa.data.records import error_records, result_records, row_answers_of
from mlxpa.engine import LLMEngine
from mlxpa.engine.metrics import Counters
from mlxpa.engine.progress import RunProgress
from mlxpa.engine.stream import RequestStream
from mlxpa.request import SampleOutput


@dataclasses.dataclass(slots=True)
class Job:
    """Pass 2: the rows through the engine, their results and error rows to the writer."""

    engine: LLMEngine
    out_fmt: str
    place: Callable[[Row], str]  # "file line 3" for run-time errors
    writer: ResultWriter
    progress: RunProgress
    # finished samples of requests whose other samples still run (a row is written whole)
    pending: dict[str, list[SampleOutput]] = dataclasses.field(default_factory=dict)
    calibration: Calibration | None = None  # applied to answers
    permute: bool = False  # questions also scored with their labels in a second order
    tally: AnswerTally | None = None  # counts each row's answers (gold figures, label order)

    def run(self, windows: Iterable[list[RowRequest]], order: str,
            should_stop: Callable[[], bool]) -> None:
        model = model_name(self.engine.config.model)
        stream = RequestStream(self.engine, order, pending=self.pending)
        for rr, outs in stream.run(self._runnable(windows), should_stop):
            if any(o.error for o in outs):
                self.engine.counters.failed_rows += 1
            answers = row_answers_of(rr.row, outs, self.calibration, self.permute)
            records = result_records(rr.row, outs, self.out_fmt, model, self.place(rr.row),
                                     self.engine.tokenizer, answers=answers)
            if self.tally is not None and answers is not None and not isinstance(answers, str):
                self.tally.add(rr.row.questions, answers.answers, rr.row.gold, answers.changed,
                               rr.row.index)
            self.writer.add(rr.row.index, records)
            self.progress.advance()

    def _runnable(self, windows: Iterable[list[RowRequest]]) -> Iterator[list[RowRequest]]:
        """Each window's rows that run, as it is read; the others written or skipped."""
        for window in windows:
            runs = write_unrunnable(window, self.writer, self.out_fmt, self.engine.counters)
            self.progress.advance(sum(rr.error is not None for rr in window))
            yield runs


def write_unrunnable(window: list[RowRequest], writer: ResultWriter, out_fmt: str,
                     counters: Counters) -> list[RowRequest]:
    """Write the error row of each row of ``window`` that cannot run (counted in
    ``counters.failed_rows``), skip each the output already holds; returns the rows that
    run, in input order."""
    runs = []
    for rr in window:
        if rr.request is not None:
            runs.append(rr)
        elif rr.error is not None:
            counters.failed_rows += 1
            writer.add(rr.row.index, error_records(rr.row, rr.error, out_fmt))
        else:
            writer.skip(rr.row.index)
    return runs


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
                   pending: Iterable[list[SampleOutput]] = (), named: bool = True) -> None:
    """Say where the rows went (unless not ``named``: a temporary output); after an
    interrupt, take the requests in flight and the finished samples of rows not written
    (``pending``; a resume runs both) out of the counters, so the report counts what was
    written, and say what was dropped."""
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
    if verbose and named and output != STDIN:
        console.print(f"wrote {written} row(s) to {output}", markup=False, highlight=False)
