"""Pass 2 of a file run (:func:`mlxpa.batch.run.run_file`): the windows of
:func:`~mlxpa.batch.requests.feed` through the engine (each window in prefix order), rows that
cannot run and rows already done straight to the writer, and the engine's outputs to result
records in the writer."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console

from mlxpa.batch.progress import RunProgress
from mlxpa.batch.report import model_name
from mlxpa.batch.requests import Fed
from mlxpa.config import SamplingParams
from mlxpa.core.prefix_order import prefix_order
from mlxpa.data import STDIN, ResultWriter, Row
from mlxpa.data.records import error_records, result_records
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.engine.metrics import Counters
from mlxpa.request import SampleOutput


@dataclasses.dataclass(slots=True)
class Job:
    """Pass 2: requests through the engine, their outputs and the error rows to the writer."""

    engine: LLMEngine
    defaults: SamplingParams
    out_fmt: str
    place: Callable[[Row], str]  # "file line 3" for run-time errors
    writer: ResultWriter
    progress: RunProgress
    in_flight: dict[int, Row] = dataclasses.field(default_factory=dict)
    # finished samples of rows whose other samples still run (a row is written whole)
    pending: dict[int, list[SampleOutput]] = dataclasses.field(default_factory=dict)
    unshown: int = 0  # rows done since the progress bar was last advanced
    shown_at: float = 0.0

    def run(self, windows: Iterable[list[Fed]], order: str,
            should_stop: Callable[[], bool]) -> None:
        model = model_name(self.engine.config.model)
        samples = self.pending
        requests = self._requests(windows, order)
        for out in self.engine.generate(requests, should_stop=should_stop):
            group = samples.setdefault(out.request_id, [])
            group.append(out)
            row = self.in_flight[out.request_id]
            if len(group) == row.params.get("n", self.defaults.n):
                del samples[row.index], self.in_flight[row.index]
                if any(o.error for o in group):
                    self.engine.counters.failed_rows += 1
                group.sort(key=lambda o: o.sample_index)
                self.writer.add(row.index, result_records(
                    row, group, self.out_fmt, model, self.place(row), self.engine.tokenizer))
                self._advance()
        self.progress.advance(self.unshown)

    def _advance(self, rows: int = 1) -> None:
        # NOTE: RunProgress.advance summarizes all counters (percentiles over every TTFT), so
        # it runs at most 10 times a second, not once a row.
        self.unshown += rows
        now = time.monotonic()
        if now - self.shown_at >= 0.1:
            self.progress.advance(self.unshown)
            self.unshown, self.shown_at = 0, now

    def _requests(self, windows: Iterable[list[Fed]], order: str) -> Iterator[PromptInput]:
        """The requests of each window (``prefix``: in depth-first order of the window's
        prompt prefix tree), after its error rows are written and its done rows skipped."""
        for window in windows:
            runs = settle(window, self.writer, self.out_fmt, self.engine.counters)
            self._advance(sum(fed.error is not None for fed in window))
            requests = []
            for fed in runs:
                self.in_flight[fed.row.index] = fed.row
                requests.append(fed.request)
            if order == "prefix":
                ordered = prefix_order([r.prompt_token_ids for r in requests],
                                       self.engine.config.block_size)
                requests = [requests[i] for i in ordered]
            yield from requests


def settle(window: list[Fed], writer: ResultWriter, out_fmt: str,
           counters: Counters) -> list[Fed]:
    """Write the error row of each row of ``window`` that cannot run (counted in
    ``counters.failed_rows``) and skip the rows the output already holds; returns the rows
    that run, in input order."""
    runs = []
    for fed in window:
        if fed.request is not None:
            runs.append(fed)
        elif fed.error is not None:
            counters.failed_rows += 1
            writer.add(fed.row.index, error_records(fed.row, fed.error, out_fmt))
        else:
            writer.skip(fed.row.index)
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
