"""The KV pool of an ``LLM`` given back between calls: ``kv_release_after`` seconds after the
last call ended, on a thread of its own (a server's engine thread does it itself when it wakes
from its idle wait: :mod:`mlxpa.engine.async_llm`).

Why a thread: the memory should go back while the caller does something else (a notebook
between cells), not at the next call, which would only drop the cache just before it is
needed again (ollama unloads an idle model on a timer the same way; vLLM leaves it to an
explicit ``LLM.sleep()``). How it stays out of the calls' way:

- every call takes the release's lock first (:meth:`IdleRelease.hold`), and the thread
  releases only while holding it, so a release never overlaps a call: a call that starts
  during one waits for it (a few milliseconds: a copy of the kept blocks, the arrays cut);
- the deadline is set when a call ends (:meth:`IdleRelease.arm`) and cleared when one starts,
  so a stream left open (``generate_iter``) is never released under;
- MLX's streams belong to the thread that made them: the thread runs on a stream of its own;
- the thread holds the engine weakly, starts at the first armed release and is stopped and
  joined when the engine goes or at interpreter exit (a thread that used MLX and ends during
  the interpreter's teardown aborts the process: :func:`~mlxpa.engine.async_llm.wait_os_thread`).
"""

from __future__ import annotations

import threading
import time
import weakref

from mlxpa.engine.async_llm import wait_os_thread
from mlxpa.engine.llm_engine import LLMEngine


class IdleRelease:
    """Calls :meth:`LLMEngine.release_kv_memory` on ``engine`` when it is due
    (:meth:`LLMEngine.kv_release_due`: ``kv_release_after`` seconds after its last step)
    after an :meth:`arm` not followed by a :meth:`hold`.

    Args:
        engine: The engine (held weakly).
    """

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = weakref.ref(engine)
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def hold(self) -> None:
        """A call starts: no release until the next :meth:`arm` (one in progress ends
        first)."""
        with self._cond:
            self._deadline = None

    def arm(self) -> None:
        """A call ended: release when due unless a call holds before (nothing when there is
        nothing to release: one segment held, or ``kv_release_after`` negative)."""
        engine = self._engine()
        due = engine.kv_release_due() if engine is not None else None
        with self._cond:
            if self._closed or due is None:
                return
            self._deadline = time.monotonic() + due
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mlxpa-kv-release",
                                                daemon=True)
                self._thread.start()
                weakref.finalize(engine, self.close)
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread and wait for it (at the engine's end, or at interpreter exit)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
            if not thread.is_alive():
                wait_os_thread(thread)

    def _run(self) -> None:
        engine = self._engine()
        if engine is None:
            return
        with engine.runner.thread_stream():
            del engine
            while self._wait():
                try:
                    engine = self._engine()
                    if engine is not None:
                        engine.release_kv_memory()
                    del engine
                finally:
                    self._cond.release()

    def _wait(self) -> bool:
        """Wait for the deadline; True holding the lock (release now), False: closed."""
        self._cond.acquire()
        while not self._closed:
            if self._deadline is None:
                self._cond.wait()
                continue
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._deadline = None
                return True
            self._cond.wait(left)
        self._cond.release()
        return False
