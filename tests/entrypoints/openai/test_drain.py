"""``mlxpa serve`` as a subprocess: SIGTERM while a stream is in flight stops new connections,
lets the stream finish (every token it asked for, then ``data: [DONE]``) and exits 0; a bad
option is a one-line usage error (exit 2) before any model work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from mlxpa.bench.server_process import free_port
from tests.entrypoints.conftest import KV_BYTES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _start(folder: str, port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-m", "mlxpa", "serve", "--model", folder, "--port", str(port),
         "--kv-cache-memory-bytes", str(KV_BYTES), "--blas", "bundled", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)


@pytest.mark.slow
def test_sigterm_drains_the_stream_in_flight_refuses_new_work_and_exits_0(folder):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(folder, port, "--timeout-graceful-shutdown", "60")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        tokens, done, started = [], [], threading.Event()

        def stream() -> None:
            body = {"prompt": "x", "max_tokens": 1200, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done.append(True)
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        tokens.append(chunk.get("usage"))
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)
        reader.join(120)
        assert proc.wait(60) == 0
        assert done == [True]
        assert tokens[-1]["completion_tokens"] == 1200  # finished, not cut
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert "Traceback" not in output, output


def test_bad_option_is_a_usage_error_before_the_model_loads(folder):
    r = subprocess.run([sys.executable, "-m", "mlxpa", "serve", "--model", folder,
                        "--max-num-waiting", "0", "--blas", "bundled"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --max-num-waiting must be >= 1, got 0"
