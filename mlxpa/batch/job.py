"""Pass 2 of a file run (:func:`mlxpa.batch.run.run_file`): rows to requests, in windows ordered by
shared prefix, through the engine, and its outputs to result records in the writer."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console

from mlxpa.batch.progress import RunProgress
from mlxpa.batch.prompts import prompt_token_ids
from mlxpa.config import SamplingParams
from mlxpa.core.prefix_order import prefix_order
from mlxpa.data import STDIN, ResultWriter, Row
from mlxpa.data.records import error_records, result_records
from mlxpa.data.resume import id_key
from mlxpa.data.validate import Validation
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.request import RequestOutput


@dataclasses.dataclass(slots=True)
class Job:
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
    # finished samples of rows whose other samples still run (a row is written whole)
    pending: dict[int, list[RequestOutput]] = dataclasses.field(default_factory=dict)
    unshown: int = 0  # rows done since the progress bar was last advanced
    shown_at: float = 0.0

    def run(self, rows: Iterable[Row], order: str, window: int,
            should_stop: Callable[[], bool]) -> None:
        model = _model_name(self.engine.config.model)
        samples = self.pending
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
                self.writer.add(row.index, result_records(
                    row, group, self.out_fmt, model, self.place(row), self.engine.tokenizer))
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
            yield PromptInput(row.index, ids, params, row.id)


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


def _model_name(spec: str | None) -> str:
    from mlxpa.loader.models import DEFAULT_MODEL_NAME

    return os.path.basename(os.path.normpath(spec)) if spec else DEFAULT_MODEL_NAME


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
                   pending: Iterable[list[RequestOutput]] = ()) -> None:
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
