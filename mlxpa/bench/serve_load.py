"""The load generator of ``mlxpa bench serve``: a workload's requests sent to a server at a
fixed concurrency or as Poisson arrivals, bounded in count and time.

As vLLM's serving benchmark: with a request rate, request ``i`` is sent at the ``i``-th
arrival of a Poisson process (exponential gaps with mean ``1 / rate``, drawn from the seed;
the first at 0 s); without one, every request is ready at 0 s. A concurrency caps the
requests in flight (a request waits for a slot, in order; that wait is not in its TTFT).
Every request has a timeout; the whole load has a deadline, after which nothing more is sent
and the requests in flight are cancelled (counted as failed, ``deadline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from mlxpa.bench.serve_client import DEADLINE, TIMEOUT, RequestResult, send
from mlxpa.bench.serve_workloads import ServeRequest


@dataclass(frozen=True)
class LoadSpec:
    """How to send a workload.

    Attributes:
        concurrency: Most requests in flight (None: no cap).
        request_rate: Poisson arrivals per second (None: every request at once, so the
            concurrency alone sets the load).
        seed: Seed of the arrival times.
        max_duration_s: Deadline of the whole load, seconds.
        request_timeout_s: Most seconds one request may take, from sending to its last event.
    """

    concurrency: int | None = None
    request_rate: float | None = None
    seed: int = 0
    max_duration_s: float = 900.0
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.concurrency is None and self.request_rate is None:
            raise ValueError("give a concurrency, a request rate or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0, got {self.request_rate}")
        if not (self.max_duration_s > 0 and self.request_timeout_s > 0):
            raise ValueError("the load's deadline and the request timeout must be > 0 seconds")

    @property
    def label(self) -> str:
        """``c=16``, ``rate=2/s`` or ``rate=2/s c=16``: the load level in tables and plots."""
        parts = [] if self.request_rate is None else [f"rate={self.request_rate:g}/s"]
        return " ".join(parts + ([] if self.concurrency is None else [f"c={self.concurrency}"]))


@dataclass
class LoadResult:
    """What a load measured: one result per request sent, in workload order.

    Attributes:
        results: The requests sent (a request never sent is not here).
        duration_s: Seconds from the first request sent to the last one ended.
        not_sent: Requests the deadline left unsent.
    """

    results: list[RequestResult]
    duration_s: float
    not_sent: int


def arrival_times(n: int, rate: float | None, seed: int = 0) -> np.ndarray:
    """Send times (seconds after the start) of ``n`` requests: a Poisson process of ``rate``
    per second (exponential gaps of mean ``1 / rate`` from ``numpy.random.default_rng(seed)``,
    the first request at 0), or all at 0 when ``rate`` is None."""
    if rate is None or n == 0:
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def _headers() -> dict[str, str]:
    """An ``Authorization`` header from ``OPENAI_API_KEY`` when set (as vLLM's bench sends)."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


async def run_load(base_url: str, requests: list[ServeRequest], spec: LoadSpec, model: str,
                   ignore_eos: bool, on_text: Callable[[int], None] | None = None,
                   ) -> LoadResult:
    """Send ``requests`` to the server at ``base_url`` as ``spec`` says (see the module).

    Args:
        base_url: ``http://host:port`` of an OpenAI-compatible server.
        requests: The workload.
        spec: Concurrency, rate, seed, deadline and timeout.
        model: The ``model`` field of every request.
        ignore_eos: Send ``ignore_eos: true``.
        on_text: Told 1 for each streamed event carrying text.

    Returns:
        The results of the requests sent and the load's duration.
    """
    offsets = arrival_times(len(requests), spec.request_rate, spec.seed)
    results: list[RequestResult | None] = [None] * len(requests)
    slots = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=spec.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits,
                                 headers=_headers()) as client:
        t0 = time.perf_counter()
        ended = [t0]

        async def one(i: int, request: ServeRequest) -> None:
            await asyncio.sleep(max(0.0, offsets[i] - (time.perf_counter() - t0)))
            async with slots or contextlib.nullcontext():
                result = results[i] = RequestResult(request.index, time.perf_counter() - t0)
                try:
                    await asyncio.wait_for(
                        send(client, request, model, ignore_eos, result, on_text or _ignore),
                        spec.request_timeout_s)
                except asyncio.TimeoutError:
                    result.fail(TIMEOUT, f"no end of stream in {spec.request_timeout_s:g} s")
                ended[0] = max(ended[0], time.perf_counter())

        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(requests)]
        _, pending = await asyncio.wait(tasks, timeout=spec.max_duration_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            ended[0] = time.perf_counter()
    for r in results:
        if r is not None and r.failure is None and not r.success:
            r.fail(DEADLINE, f"still running at the deadline ({spec.max_duration_s:g} s)")
    sent = [r for r in results if r is not None]
    return LoadResult(sent, ended[0] - t0, len(requests) - len(sent))


def _ignore(n: int) -> None:
    pass


def drive(base_url: str, requests: list[ServeRequest], spec: LoadSpec, model: str,
          ignore_eos: bool, on_text: Callable[[int], None] | None = None) -> LoadResult:
    """:func:`run_load` from synchronous code (its own event loop)."""
    return asyncio.run(run_load(base_url, requests, spec, model, ignore_eos, on_text))
