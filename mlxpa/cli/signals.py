"""Ctrl-C and SIGTERM during ``mlxpa run``: stop admitting rows, keep every finished one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class StopEvent(threading.Event):
    """The stop request, polled through :meth:`should_stop`, whose first call marks that
    rows have started to run (before that, a signal stops at once)."""

    working = False

    def should_stop(self) -> bool:
        """True once stopping was asked (``run_file``'s ``should_stop``)."""
        self.working = True
        return self.is_set()


@contextlib.contextmanager
def catch_sigint() -> Iterator[StopEvent]:
    """Turn the first Ctrl-C (SIGINT) or SIGTERM (``timeout``, ``docker stop``, batch
    schedulers) into a set event (poll it with ``should_stop``); a second one raises
    ``KeyboardInterrupt``. Before the first poll (reading the input, loading the model)
    a signal raises ``KeyboardInterrupt`` at once. Off the main thread, nothing is
    installed."""
    stop = StopEvent()

    def handler(signum: int, frame: object) -> None:
        name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        if not stop.working:  # still reading the input or loading the model: stop now
            stop.set()
            os.write(2, f"\ninterrupted ({name}) before any row ran: stopping\n".encode())
            raise KeyboardInterrupt
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        os.write(2, f"\ninterrupted ({name}): writing the finished rows (again to quit now)\n"
                 .encode())

    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)

