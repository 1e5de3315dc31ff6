"""A running ``mlxpa serve`` app on a tiny random llama (the parent conftest's model folder:
byte tokenizer, EOS id 1, a chat template), in this process: the engine thread and uvicorn in
a thread on 127.0.0.1 and a free port. The oracle is ``LLM`` on the same folder and engine
options."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from mlxpa.bench.server_process import free_port
from mlxpa.config import EngineConfig
from mlxpa.engine.async_llm import AsyncLLM
from mlxpa.entrypoints.openai.app import ServerSettings, build_app
from mlxpa.entrypoints.openai.server import server_config
from tests.entrypoints.conftest import KV_BYTES

# A short context keeps requests without max_tokens quick (they run to its end).
ENGINE = {"kv_cache_memory_bytes": KV_BYTES, "max_model_len": 192, "max_num_seqs": 16,
          "block_size": 16}
NAME = "tiny"


@dataclass
class Server:
    """A server in this process: its URL, its engine, its uvicorn."""

    url: str
    llm: AsyncLLM
    uvicorn: object

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` as ``{name: value}`` (the first sample of each name)."""
        values: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values.setdefault(name.split("{", 1)[0], float(value))
        return values

    def wait_idle(self, timeout_s: float = 20.0) -> dict[str, float]:
        """Poll ``/metrics`` until no request runs or waits; the last reading."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            idle = m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)


@contextlib.contextmanager
def running_server(folder: str, *, max_num_waiting: int | None = None,
                   engine: dict | None = None, **settings) -> Iterator[Server]:
    """Serve ``folder`` with :data:`ENGINE` and ``engine`` (``settings``:
    :class:`ServerSettings` fields)."""
    config = EngineConfig(model=folder, **{**ENGINE, **(engine or {})})
    llm = AsyncLLM(config, max_num_waiting=max_num_waiting)
    llm.start()
    app = build_app(llm, ServerSettings(NAME, **settings))
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, 5.0, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield Server(f"http://127.0.0.1:{port}", llm, server)
    finally:
        server.should_exit = True
        thread.join(30)
        llm.shutdown()


@pytest.fixture(scope="module")
def server(folder) -> Iterator[Server]:
    with running_server(folder) as s:
        yield s


@pytest.fixture(scope="module")
def oracle(folder):
    """``LLM`` on the same folder and engine options as the server."""
    from mlxpa import LLM

    return LLM(folder, **ENGINE)


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
