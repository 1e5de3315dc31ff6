"""Ctrl-C and SIGTERM during ``mlxpa run``: stop admitting rows, keep every finished one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def catch_sigint() -> Iterator[threading.Event]:
    """Turn the first Ctrl-C (SIGINT) or SIGTERM (``timeout``, ``docker stop``, batch
    schedulers) into a set event (poll it as ``should_stop``); a second one raises
    ``KeyboardInterrupt``. Off the main thread, nothing is installed."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
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

