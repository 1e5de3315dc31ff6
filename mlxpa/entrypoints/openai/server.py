"""Running the app on uvicorn with a drain: SIGTERM (or Ctrl-C) closes the listening socket
(new connections are refused), lets the requests in flight finish for up to
``timeout_graceful_shutdown`` seconds (then cancels them, which aborts their engine requests)
and returns, so the process exits 0. A second Ctrl-C quits at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose signal handling ends the run instead of re-raising the signal
    after the drain (uvicorn's default, which would make the exit status the signal's)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {sig: signal.signal(sig, self.handle_exit)
               for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def server_config(app: FastAPI, host: str, port: int, timeout_graceful_shutdown: float,
                  access_log: bool = True) -> uvicorn.Config:
    """uvicorn's configuration of the app (its own log lines at INFO)."""
    return uvicorn.Config(app, host=host, port=port, log_level="info", access_log=access_log,
                          timeout_graceful_shutdown=timeout_graceful_shutdown,
                          timeout_keep_alive=5, server_header=False)


def run_server(app: FastAPI, host: str, port: int, timeout_graceful_shutdown: float) -> None:
    """Serve ``app`` until SIGTERM or Ctrl-C, then drain.

    Raises:
        SystemExit: uvicorn could not listen (the port is taken; its log says why).
    """
    DrainingServer(server_config(app, host, port, timeout_graceful_shutdown)).run()
