"""The engine for requests that arrive while others run (vLLM's ``AsyncLLM`` shape): one thread
owns MLX and the :class:`~mlxpa.engine.llm_engine.LLMEngine` (built in that thread), runs
``step()`` while work exists and sleeps otherwise; requests and aborts enter through a
thread-safe queue and are applied between steps; each request's outputs reach its asyncio
caller as they are produced (``loop.call_soon_threadsafe``)::

    asyncio callers ── generate(request) ──► inbox (queue) ──► engine thread
                    ◄── per-request asyncio queue ◄── step() outputs (DELTA or final)

The KV pool follows the load: it starts at one segment, grows by segments as steps need
blocks (before anything cached is evicted), up to the memory budget, and once the engine has
had no work for ``kv_release_after`` seconds the thread, waking from its idle wait, gives the
segments back but one (:meth:`LLMEngine.release_kv_memory`). Its prefix cache lives as long
as the engine: a prompt prefix many requests share is computed once while its blocks stay
cached (LRU eviction under pressure; an idle release keeps what fits in one segment). A
caller that stops reading (its client went away) aborts its request: its blocks return to
the pool before the next step.

Scheduling policy for online work (the scheduler's own, :mod:`mlxpa.core.scheduler`): every
step first gives each running request, in admission order, its next token (a decode) or its
next prefill chunk, then admits waiting requests in arrival order (first come, first served)
with the token budget left (``max_num_batched_tokens``); a prompt longer than the budget is
prefilled in chunks over several steps, so running decodes get a token every step. The one
exception to arrival order: a request whose prompt shares blocks with a prompt still being
prefilled waits for those blocks to be cached instead of computing them twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NamedTuple

from mlxpa.config import EngineConfig
from mlxpa.engine.llm_engine import LLMEngine
from mlxpa.engine.metrics import Counters
from mlxpa.request import EngineRequest, SampleOutput


class EngineDeadError(RuntimeError):
    """The engine thread stopped (a step raised, or the engine shut down): no request runs."""


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_num_waiting`` requests already; try again later."""


class EngineStats(NamedTuple):
    """What the engine thread publishes after each step (read from any thread).

    Attributes:
        num_running: Samples running (decoding or prefilling).
        num_waiting: Samples waiting (queued, preempted, not forked yet), plus requests not
            yet handed to the engine.
        kv_blocks_in_use: KV blocks held by requests (blocks only the prefix cache holds
            are free to evict and not counted, as in vLLM).
        kv_blocks_total: Usable KV blocks of the pool at its ceiling (the null block left
            out).
        kv_pool_blocks: Usable KV blocks the pool holds now.
        kv_pool_bytes: Bytes of the KV pool's arrays now (null block included).
        kv_pool_ceiling_bytes: Bytes they would take at the ceiling (the budget).
        counters: A copy of the engine's :class:`~mlxpa.engine.metrics.Counters` since start
            (prompt, cached and generated tokens, preemptions), latency lists left empty.
    """

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_in_use: int = 0
    kv_blocks_total: int = 0
    kv_pool_blocks: int = 0
    kv_pool_bytes: int = 0
    kv_pool_ceiling_bytes: int = 0
    counters: Counters = Counters()


@dataclass
class _Add:
    request: EngineRequest
    put: Callable[[object], None]
    submitted: float


@dataclass
class _Sink:
    put: Callable[[object], None]
    left: int  # samples not finished yet
    submitted: float


_STOP = object()


class AsyncLLM:
    """An engine thread behind an asyncio face.

    Args:
        config: Engine configuration (the model loads in the engine thread).
        max_num_waiting: Most requests waiting (not yet running) before :meth:`generate`
            refuses new ones with :class:`QueueFullError` (None: no bound).
        engine_factory: Builds the engine, in the engine thread (default:
            ``LLMEngine(config)``, its KV pool growing up to the memory budget).
        on_finished: Called in the engine thread with every finished sample's output and its
            end-to-end seconds (from :meth:`generate` to the output), e.g. for histograms.
        on_aborted: Called in the engine thread with the number of samples left unfinished
            when a caller's request is aborted (its caller stopped reading).
    """

    def __init__(self, config: EngineConfig, *, max_num_waiting: int | None = None,
                 engine_factory: Callable[[], LLMEngine] | None = None,
                 on_finished: Callable[[SampleOutput, float], None] | None = None,
                 on_aborted: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.max_num_waiting = max_num_waiting
        self._factory = engine_factory or (lambda: LLMEngine(config))
        self.on_finished, self.on_aborted = on_finished, on_aborted
        self.engine: LLMEngine | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._lock = threading.Lock()
        self._queued = 0  # requests put in the inbox, not yet counted by the engine's stats
        self._applied = 0  # requests handed to the engine since the last _publish
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="mlxpa-engine", daemon=True)
        self.stats = EngineStats()

    # ----------------------------------------------------------------- any thread

    def start(self) -> AsyncLLM:
        """Start the engine thread and wait until the engine is built (the model loaded).

        Raises:
            Whatever building the engine raised (a missing model, a bad option).
        """
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def is_alive(self) -> bool:
        """The engine thread runs and takes requests."""
        return self._thread.is_alive() and self._error is None

    def abort(self, request_id: str) -> None:
        """Abort the request ``request_id`` between steps (an unknown or finished id is
        ignored); its blocks return to the pool."""
        self._inbox.put(("abort", request_id))

    def shutdown(self, timeout_s: float | None = 30.0) -> None:
        """Stop the engine thread: requests still in flight are aborted (their callers get
        :class:`EngineDeadError`); waits up to ``timeout_s`` for the thread."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                wait_os_thread(self._thread)

    def num_waiting(self) -> int:
        """Requests waiting: in the engine's queue or not yet handed to it."""
        with self._lock:
            return self._queued + self.stats.num_waiting

    async def generate(self, request: EngineRequest) -> AsyncIterator[SampleOutput]:
        """Run ``request``; yield its outputs as the engine thread produces them (with
        ``output_kind`` ``DELTA``, one per step per sample; else one per sample), until each
        of its ``n`` samples has finished. Closing the iterator before that (a client that
        went away, a cancelled task) aborts the request.

        Raises:
            QueueFullError: ``max_num_waiting`` requests wait already.
            EngineDeadError: The engine thread is not running.
            ValueError, TypeError: The engine refused the request (an id in flight).
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()

        def put(item: object) -> None:
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, item)
            except RuntimeError:  # the caller's loop closed: nobody reads this any more
                pass

        with self._lock:
            self._queued += 1
        self._inbox.put(_Add(request, put, time.perf_counter()))
        left = request.sampling_params.n
        try:
            while left:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    left = 0
                    raise item
                left -= item.finished
                yield item
        finally:
            if left:
                self.abort(request.request_id)

    def _check_open(self) -> None:
        if not self.is_alive:
            raise EngineDeadError("the engine is not running"
                                  + (f": {self._error}" if self._error else ""))
        if self.max_num_waiting is not None and self.num_waiting() >= self.max_num_waiting:
            raise QueueFullError(f"{self.max_num_waiting} requests are waiting already "
                                 "(--max-num-waiting); try again later")

    # ---------------------------------------------------------------- engine thread

    def _main(self) -> None:
        try:
            self.engine = self._factory()
            # The grammar tokenizer's build (a daemon thread) ends before the first request:
            # a constrained request then never waits for it, and no build is left running
            # when the process exits (its thread would abort the interpreter's teardown).
            self.engine.prepare()
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
            return
        self._publish()
        self._ready.set()
        try:
            self._loop()
        except BaseException as e:  # a step failed: every caller is told, none hangs
            traceback.print_exc()  # the server's log keeps where it failed
            self._error = e
            self._fail_all(EngineDeadError(f"the engine stopped: {type(e).__name__}: {e}"))

    def _loop(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests() or engine.scheduler.has_finished_requests()
            due = None if busy else engine.kv_release_due()
            commands = self._take(block=not busy, timeout=due)
            if not busy and due is not None and not commands:  # idle for kv_release_after
                engine.release_kv_memory()
                self._publish()
            for command in commands:
                if command is _STOP:
                    self._error = EngineDeadError("the engine was shut down")
                    self._fail_all(self._error)
                    engine.close()  # the disk KV tier keeps what the requests shared
                    return
                self._apply(command)
            if commands:
                self._publish()
            if engine.has_unfinished_requests() or engine.scheduler.has_finished_requests():
                outputs = engine.step()
                self._publish()  # before a caller can see the step's outputs
                self._dispatch(outputs)

    def _take(self, block: bool, timeout: float | None = None) -> list[object]:
        """Every command in the inbox; waits for one when ``block`` (the engine is idle), at
        most ``timeout`` seconds (None: as long as it takes)."""
        commands = []
        if block:
            try:
                commands.append(self._inbox.get(timeout=timeout))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, command: object) -> None:
        engine = self.engine
        if isinstance(command, tuple):  # ("abort", request id)
            engine.abort_request(command[1])
            sink = self._sinks.pop(command[1], None)
            if sink is not None and self.on_aborted is not None:
                self.on_aborted(sink.left)
            return
        self._applied += 1
        request = command.request
        try:
            engine.add_request(*request)  # outputs come out of the next step
        except (TypeError, ValueError) as e:
            command.put(e)
            return
        self._sinks[request.request_id] = _Sink(command.put, request.sampling_params.n,
                                                command.submitted)

    def _dispatch(self, outputs: list[SampleOutput]) -> None:
        now = time.perf_counter()
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if sink is None:  # aborted while the step ran
                continue
            if out.finished and self.on_finished is not None:  # observed before it is seen
                self.on_finished(out, now - sink.submitted)
            sink.put(out)
            if not out.finished:
                continue
            sink.left -= 1
            if not sink.left:
                del self._sinks[out.request_id]

    def _publish(self) -> None:
        """Publish :class:`EngineStats`; drop the engine's per-request latency lists (the
        outputs carry them; a server runs for days)."""
        engine = self.engine
        kv, c = engine.kv_cache_manager, engine.counters
        c.ttft_s.clear()
        c.itl_s.clear()
        block_nbytes = engine.runner.kv_cache.block_nbytes
        stats = EngineStats(len(engine.scheduler.running), engine.num_waiting,
                            kv.num_active_blocks, kv.pool.max_usable_blocks,
                            kv.pool.num_usable_blocks, engine.runner.kv_cache.nbytes,
                            kv.pool.max_num_blocks * block_nbytes,
                            dataclasses.replace(c, ttft_s=[], itl_s=[]))
        with self._lock:  # a request moves from the inbox's count to the engine's at once
            self._queued -= self._applied
            self._applied = 0
            self.stats = stats

    def _fail_all(self, error: BaseException) -> None:
        """Tell every caller in flight, and every request still in the inbox, ``error``;
        abort what the engine holds."""
        for sink in self._sinks.values():
            sink.put(error)
        self._sinks.clear()
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                self._applied += 1
                command.put(error)
        try:
            self.engine.abort_unfinished()
        except Exception:  # the engine is broken already; its callers know
            pass


def wait_os_thread(thread: threading.Thread, timeout_s: float = 5.0) -> None:
    """Wait until the OS thread behind ``thread`` (joined) is gone. After ``join`` returns it
    still runs its C++ thread-local destructors, MLX's compile cache among them, which take
    the GIL; an interpreter that starts its teardown meanwhile makes that thread exit inside
    them, and the process aborts (``terminate called without an active exception``). Linux
    lists a process's threads in ``/proc``; elsewhere a short sleep hands over the GIL."""
    task = f"/proc/self/task/{thread.native_id}"
    if not os.path.isdir("/proc/self/task"):
        time.sleep(0.1)
        return
    deadline = time.monotonic() + timeout_s
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.005)
