"""Pass 2's streaming core: windows of rows in, each row's finished samples out. The file run
(:class:`~mlxpa.batch.job.Job`), the Ray replicas and the Python API
(:class:`mlxpa.entrypoints.llm.LLM`) all run their rows through it::

    windows of Fed (row, request | error)
      ─► per window: a row that cannot run handed back in its place (Passthrough),
         the requests in prefix order (core/prefix_order.py)
      ─► LLMEngine.generate ─► SampleOutputs, grouped by row until its n samples are in
      ─► RowResult(fed, outputs) as rows finish (in_input_order: in input order)

Memory: the engine pulls requests only while its waiting queue is short (``2 *
max_num_seqs``), and a window is read when its first request is pulled, so at most one window
is read ahead of the requests in the engine; in input order, finished rows are also held until
every earlier row has finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from mlxpa.batch.requests import Fed
from mlxpa.core.prefix_order import prefix_order
from mlxpa.engine import LLMEngine, Passthrough, PromptInput
from mlxpa.request import SampleOutput


class RowResult(NamedTuple):
    """One row done.

    Attributes:
        fed: The row with its request, or with the error it got (``fed.request`` None: the
            row did not run; ``fed.error`` None too: the output already holds it).
        outputs: Its ``n`` samples' outputs in sample order; empty when it did not run.
    """

    fed: Fed
    outputs: list[SampleOutput]


@dataclasses.dataclass(slots=True)
class RowStream:
    """Rows through one engine, each window admitted in prefix order.

    Attributes:
        engine: The engine.
        order: ``prefix`` (each window in depth-first order of its prompts' prefix tree) or
            ``input``.
        in_flight: Row index to its row, for the rows whose requests the engine has.
        pending: Finished samples of rows whose other samples still run (a row is done
            whole).
    """

    engine: LLMEngine
    order: str = "prefix"
    in_flight: dict[int, Fed] = dataclasses.field(default_factory=dict)
    pending: dict[int, list[SampleOutput]] = dataclasses.field(default_factory=dict)

    def run(self, windows: Iterable[list[Fed]],
            should_stop: Callable[[], bool] | None = None) -> Iterator[RowResult]:
        """Every row of ``windows`` (pulled lazily), as it finishes; a row that cannot run
        (or is already done) when it is pulled.

        Args:
            windows: Lists of rows; a row's request id is its ``row.index``.
            should_stop: Polled between engine steps; True ends the stream (the rows in
                flight stay in :attr:`in_flight` and :attr:`pending`).
        """
        for out in self.engine.generate(self._requests(windows), should_stop=should_stop):
            if isinstance(out, Passthrough):
                yield RowResult(out.item, [])
                continue
            group = self.pending.setdefault(out.request_id, [])
            group.append(out)
            fed = self.in_flight[out.request_id]
            if len(group) == fed.request.params.n:
                del self.pending[out.request_id], self.in_flight[out.request_id]
                group.sort(key=lambda o: o.sample_index)
                yield RowResult(fed, group)

    def _requests(self, windows: Iterable[list[Fed]]) -> Iterator[PromptInput | Passthrough]:
        for window in windows:
            requests = []
            for fed in window:
                if fed.request is None:
                    yield Passthrough(fed)
                else:
                    self.in_flight[fed.request.request_id] = fed
                    requests.append(fed.request)
            if self.order == "prefix":
                ordered = prefix_order([r.prompt_token_ids for r in requests],
                                       self.engine.config.block_size)
                requests = [requests[i] for i in ordered]
            yield from requests


def in_input_order(results: Iterable[RowResult]) -> Iterator[RowResult]:
    """``results`` in input order: each is held until the rows before it (row indices 0, 1,
    2, ... with none missing) have come."""
    held: dict[int, RowResult] = {}
    upcoming = 0
    for result in results:
        held[result.fed.row.index] = result
        while upcoming in held:
            yield held.pop(upcoming)
            upcoming += 1
