"""A server under test as a subprocess: started on 127.0.0.1 and a free port, ready when its
health route answers 200, stopped (SIGTERM, then SIGKILL) when done; and the peak resident
memory of a process tree, sampled while a load runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

import httpx
import psutil

HOST = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited or never answered its health route; the message ends with the last
    lines of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server command run as a subprocess (its own process group), its output in a log file.

    Use as a context manager: ``__enter__`` starts it and waits until ``GET health_path``
    answers 200; ``__exit__`` stops it.

    Args:
        argv: The command.
        base_url: Where it will listen (``http://127.0.0.1:PORT``).
        health_path: Its readiness route.
        start_timeout_s: Most seconds to wait for readiness.
        env: Extra environment variables.

    Raises:
        ServerStartError: At ``__enter__``: the command cannot run, exits, or is not ready in
            time (the server is then stopped).
    """

    def __init__(self, argv: list[str], base_url: str, health_path: str = "/health",
                 start_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        self.argv, self.base_url, self.health_path = argv, base_url, health_path
        self.start_timeout_s, self.env = start_timeout_s, env
        self.proc: subprocess.Popen | None = None
        self.log_path = ""

    def __enter__(self) -> ServerProcess:
        fd, self.log_path = tempfile.mkstemp(prefix="mlxpa-bench-server-", suffix=".log")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=fd, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **(self.env or {})})
        except OSError as e:
            raise ServerStartError(f"cannot run {self.argv[0]}: {e}") from None
        finally:
            os.close(fd)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        url = self.base_url + self.health_path
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"{' '.join(self.argv[:4])} ... exited with code {code} "
                                       f"before it was ready{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"GET {url} did not answer 200 within "
                                       f"{self.start_timeout_s:g} s{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of the server's log but its health-check access lines
        (which would hide why it is not ready), indented, after a colon."""
        try:
            with open(self.log_path, errors="replace") as f:
                kept = [t for t in f.read().splitlines() if self.health_path + " " not in t]
        except OSError:
            return ""
        tail = kept[-lines:]
        return (f"; last lines of {self.log_path}:\n" + "\n".join("    " + t for t in tail)
                if tail else f"; its log {self.log_path} says nothing more")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)  # the group this object started
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and all its descendants (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRSS:
    """The largest :func:`tree_rss` of ``pid`` seen while the context is open, sampled every
    ``interval_s`` seconds on a thread (and once on entry and exit); ``peak_bytes`` is None
    without a pid."""

    def __init__(self, pid: int | None, interval_s: float = 0.1) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        if self.pid is not None:
            self.peak_bytes = max(self.peak_bytes or 0, tree_rss(self.pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakRSS:
        self._sample()
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._sample()
