"""The systems ``mlxpa bench serve`` measures, one after another, on the same requests.

A server system is one entry of :data:`SERVERS`: the command that starts it on a model folder
and a port (run by :class:`~mlxpa.bench.server_process.ServerProcess` on 127.0.0.1 and a free
port, ready when its health route answers 200, stopped after its loads), whether it takes
vLLM's ``ignore_eos``, and the ``model`` field its requests name (None: the first id of its
``GET /v1/models``). Each server is warmed up with a few requests, then driven at every load
level in turn while its process tree's resident memory is sampled. ``mlxpa-offline``
(:mod:`~mlxpa.bench.serve_offline`) runs the first level's requests through the Python API;
``--url`` drives a server that is already running. A system that cannot start is reported,
and the others still run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from mlxpa.bench.progress import BenchProgress
from mlxpa.bench.serve_figures import load_figures
from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_offline import LOAD_LABEL, OFFLINE, run_offline
from mlxpa.bench.serve_workloads import ServeRequest
from mlxpa.bench.server_process import HOST, PeakRSS, ServerProcess, ServerStartError, free_port


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server system and talk to it.

    Attributes:
        name: The system's name in ``--baselines`` and the report.
        argv: ``(model folder, port) -> command`` listening on 127.0.0.1 and that port.
        ignore_eos: The server takes vLLM's ``ignore_eos`` field (else requests end at EOS
            or ``max_tokens``, and the tokens that came back are counted).
        model_name: The ``model`` field of its requests; None: the first id of
            ``GET /v1/models``.
        health_path: The route that answers 200 once the server is ready.
    """

    name: str
    argv: Callable[[str, int], list[str]]
    ignore_eos: bool
    model_name: str | None = None
    health_path: str = "/health"


def mlxpa_serve_argv(model: str, port: int) -> list[str]:
    """``mlxpa serve --model M --host 127.0.0.1 --port P`` with this interpreter."""
    return [sys.executable, "-m", "mlxpa", "serve", "--model", model, "--host", HOST,
            "--port", str(port)]


def mlx_lm_server_argv(model: str, port: int) -> list[str]:
    """``mlx_lm server --model M --host 127.0.0.1 --port P`` (mlx_lm.server) with this
    interpreter."""
    return [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--host", HOST,
            "--port", str(port)]


# Every server system by name, in report order. mlx_lm.server serves the model it was started
# with under the name "default_model" (its /v1/models lists the Hugging Face cache instead).
SERVERS: dict[str, ServerSpec] = {
    "mlxpa": ServerSpec("mlxpa", mlxpa_serve_argv, ignore_eos=True),
    "mlx-lm-server": ServerSpec("mlx-lm-server", mlx_lm_server_argv, ignore_eos=False,
                                model_name="default_model"),
}
SYSTEMS = (*SERVERS, OFFLINE)


@dataclass
class ServeRun:
    """The figures of one system at one load level (``load``: its label, or ``offline``)."""

    system: str
    load: str
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Level:
    """One load level: how to send, and the requests it sends."""

    spec: LoadSpec
    requests: list[ServeRequest]


def served_model(base_url: str) -> str:
    """The first model id of ``GET /v1/models``.

    Raises:
        ServerStartError: The route fails or lists no model.
    """
    try:
        data = httpx.get(base_url + "/v1/models", timeout=30.0).json()["data"]
        return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ServerStartError(f"GET {base_url}/v1/models named no model ({e!r}); give "
                               "--served-model-name") from None


class ServeBench:
    """Runs systems on load levels and collects :class:`ServeRun` s and start failures.

    Args:
        levels: The load levels, each with its requests.
        warmup: Requests sent before a server's first level (not measured).
        count_tokens: Tokens of a text (servers that send no usage).
        ignore_eos: Ask servers that take ``ignore_eos`` to ignore EOS.
        progress: Bars per measured run (None: none drawn).
    """

    def __init__(self, levels: list[Level], warmup: list[ServeRequest],
                 count_tokens: Callable[[str], int], ignore_eos: bool = True,
                 progress: BenchProgress | None = None) -> None:
        self.levels, self.warmup, self.count_tokens = levels, warmup, count_tokens
        self.ignore_eos = ignore_eos
        self.progress = progress or BenchProgress(enabled=False)
        self.runs: list[ServeRun] = []
        self.failed: dict[str, str] = {}

    def run_server(self, spec: ServerSpec, model: str, start_timeout_s: float = 300.0) -> None:
        """Start ``spec``'s server on ``model`` (a folder), drive it at every level, stop it;
        a server that cannot start or answer is recorded in ``failed``."""
        base = f"http://{HOST}:{(port := free_port())}"
        try:
            with ServerProcess(spec.argv(model, port), base, spec.health_path,
                               start_timeout_s) as server:
                self.drive(spec.name, base, spec.model_name or served_model(base),
                           self.ignore_eos and spec.ignore_eos, server.pid)
        except ServerStartError as e:
            self.failed[spec.name] = str(e)

    def drive(self, name: str, base_url: str, model_name: str, ignore_eos: bool,
              pid: int | None) -> None:
        """Warm the server at ``base_url`` up, then drive it at every level (``pid``: the
        server's process, whose tree's peak RSS is sampled; None: not measured)."""
        if self.warmup:
            warm = drive(base_url, self.warmup, LoadSpec(concurrency=len(self.warmup),
                                                         request_timeout_s=600.0),
                         model_name, ignore_eos)
            if not any(r.success for r in warm.results):
                first = warm.results[0].error if warm.results else "nothing sent"
                self.failed[name] = f"every warm-up request failed: {first}"
                return
        for i, level in enumerate(self.levels):
            bar = self.progress.bar(f"{name} {level.spec.label} [{i + 1}/{len(self.levels)}]",
                                    sum(r.max_tokens for r in level.requests))
            with PeakRSS(pid) as rss:
                load = drive(base_url, level.requests, level.spec, model_name, ignore_eos,
                             bar.advance)
            figures = load_figures(load, level.requests, self.count_tokens)
            figures["peak_rss_bytes"] = rss.peak_bytes
            bar.done(f"{figures['output_tokens_per_s']:.1f} out tok/s, "
                     f"{figures['failed']} failed")
            self.runs.append(ServeRun(name, level.spec.label, figures))

    def run_offline(self, model: str | None, **engine_args) -> None:
        """``mlxpa-offline`` on the first level's requests (see
        :mod:`~mlxpa.bench.serve_offline`); a model that cannot load is recorded in
        ``failed``."""
        requests = self.levels[0].requests
        bar = self.progress.bar(f"{OFFLINE} (first level's requests, all at once)",
                                sum(r.max_tokens for r in requests))
        try:
            figures = run_offline(model, requests, self.warmup, self.ignore_eos, bar.advance,
                                  **engine_args)
        except (FileNotFoundError, ValueError) as e:
            self.failed[OFFLINE] = str(e)
            bar.done("failed")
            return
        bar.done(f"{figures['output_tokens_per_s']:.1f} out tok/s")
        self.runs.append(ServeRun(OFFLINE, LOAD_LABEL, figures))

    def run(self, systems: tuple[str, ...], model: str, start_timeout_s: float = 300.0
            ) -> None:
        """Every system of ``systems`` (names of :data:`SYSTEMS`) in order.

        Raises:
            ValueError: An unknown system name.
        """
        unknown = [s for s in systems if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
        for name in systems:
            if name == OFFLINE:
                self.run_offline(model)
            else:
                self.run_server(SERVERS[name], model, start_timeout_s)
