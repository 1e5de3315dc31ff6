"""Offline streaming over one engine: windows of items in, each item's finished samples out.
The file run, the Ray replicas and the Python API (:class:`mlxpa.entrypoints.llm.LLM`) run
their requests through it::

    windows of items (each with its EngineRequest, or None: it cannot run)
      ─► per window: items that cannot run set aside, the requests in prefix order
         (core/prefix_order.py)
      ─► LLMEngine.generate ─► SampleOutputs, grouped by request id until its n samples are in
      ─► Finished(item, outputs) as items finish, the items set aside drained in their place
         (in_input_order: in input order)

Memory: the engine pulls requests only while its waiting queue is short (``2 *
max_num_seqs``), and a window is read when its first request is pulled, so at most one window
is read ahead of the requests in the engine. Items set aside wait for the engine's next output;
a caller with long runs of them (a resumed file's rows already done) keeps them on its own side
instead, as the file run does (:func:`mlxpa.batch.job.write_unrunnable`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, NamedTuple, Protocol, TypeVar

from mlxpa.core.prefix_order import prefix_order
from mlxpa.engine.llm_engine import LLMEngine
from mlxpa.request import EngineRequest, SampleOutput


class HasRequest(Protocol):
    """An item of the stream: whatever the caller keeps with its request (a file row, a
    prompt's index and text); None: the item cannot run."""

    @property
    def request(self) -> EngineRequest | None: ...


T = TypeVar("T", bound=HasRequest)
U = TypeVar("U")


class Finished(NamedTuple, Generic[T]):
    """One item done.

    Attributes:
        item: The item as it was given.
        outputs: Its request's ``n`` samples' outputs, in sample order; empty for an item
            that could not run.
    """

    item: T
    outputs: list[SampleOutput]


@dataclasses.dataclass(slots=True)
class RequestStream(Generic[T]):
    """Items through one engine, each window admitted in prefix order.

    Attributes:
        engine: The engine.
        order: ``prefix`` (each window in depth-first order of its prompts' prefix tree) or
            ``input``.
        in_flight: Request id to its item, for the items whose requests the engine has.
        pending: Finished samples of requests whose other samples still run (an item is
            done whole).
        aside: Items that cannot run, read but not yet handed back.
    """

    engine: LLMEngine
    order: str = "prefix"
    in_flight: dict[str, T] = dataclasses.field(default_factory=dict)
    pending: dict[str, list[SampleOutput]] = dataclasses.field(default_factory=dict)
    aside: deque[T] = dataclasses.field(default_factory=deque)

    def run(self, windows: Iterable[list[T]],
            should_stop: Callable[[], bool] | None = None) -> Iterator[Finished[T]]:
        """Every item of ``windows`` (pulled lazily), as it finishes; an item that cannot run
        after it is read, before the next output.

        Args:
            windows: Lists of items; their request ids are unique among the items in flight
                (the engine refuses an id it is still running).
            should_stop: Polled between engine steps; True ends the stream (the items in
                flight stay in :attr:`in_flight` and :attr:`pending`, those set aside in
                :attr:`aside`).
        """
        for out in self.engine.generate(self._requests(windows), should_stop=should_stop):
            yield from self._drain()
            group = self.pending.setdefault(out.request_id, [])
            group.append(out)
            item = self.in_flight[out.request_id]
            if len(group) == item.request.sampling_params.n:
                del self.pending[out.request_id], self.in_flight[out.request_id]
                group.sort(key=lambda o: o.sample_index)
                yield Finished(item, group)
        if should_stop is None or not should_stop():
            yield from self._drain()

    def _drain(self) -> Iterator[Finished[T]]:
        while self.aside:
            yield Finished(self.aside.popleft(), [])

    def _requests(self, windows: Iterable[list[T]]) -> Iterator[EngineRequest]:
        for window in windows:
            requests = []
            for item in window:
                if item.request is None:
                    self.aside.append(item)
                    continue
                self.in_flight[item.request.request_id] = item
                requests.append(item.request)
            if self.order == "prefix":  # each cache salt's rows apart (they share nothing)
                ordered = prefix_order([r.prompt_token_ids for r in requests],
                                       self.engine.config.block_size,
                                       [r.cache_salt for r in requests])
                requests = [requests[i] for i in ordered]
            yield from requests


def in_input_order(results: Iterable[Finished[T]],
                   index_of: Callable[[T], int]) -> Iterator[Finished[T]]:
    """``results`` in input order: each is held until the items before it (``index_of`` its
    item 0, 1, 2, ... with none missing) have come."""
    held: dict[int, Finished[T]] = {}
    upcoming = 0
    for result in results:
        held[index_of(result.item)] = result
        while upcoming in held:
            yield held.pop(upcoming)
            upcoming += 1


def windows(items: Iterable[U], size: int) -> Iterator[list[U]]:
    """``items`` in lists of ``size`` (the last may be shorter; none is empty)."""
    window: list[U] = []
    for item in items:
        window.append(item)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window
