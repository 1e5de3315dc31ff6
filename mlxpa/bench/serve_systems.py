"""The systems ``mlxpa bench serve`` measures, one after another, on the same requests.

A server system is one entry of :data:`SERVERS` (or a spec the caller adds, such as
:mod:`~mlxpa.bench.llama_server`'s): the command that starts it on a model folder and a port
(run by :class:`~mlxpa.bench.server_process.ServerProcess` on 127.0.0.1 and a free port, an
MLX server with the BLAS this process runs, :func:`~mlxpa.blas.child_blas_env`; ready when
its health route answers 200, stopped after its loads), whether it takes vLLM's
``ignore_eos``, and the ``model`` field its requests name (None: the first id of its
``GET /v1/models``). Each server is warmed up until it has generated tokens
(:mod:`~mlxpa.bench.serve_warmup`); then what its process maps and its thread settings are
read from ``/proc`` (:mod:`~mlxpa.bench.process_env`), and it is driven at every load level
in turn while its process tree's resident memory is sampled. ``mlxpa-offline``
(:mod:`~mlxpa.bench.serve_offline`) runs each endpoint's first level through the Python API;
``--url`` drives a server that is already running. A system that cannot start is reported,
and the others still run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from mlxpa.bench.process_env import process_record
from mlxpa.bench.progress import BenchProgress
from mlxpa.bench.serve_figures import load_figures
from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_offline import LOAD_LABEL, OFFLINE, run_offline
from mlxpa.bench.serve_warmup import WarmupError, warm_up
from mlxpa.bench.serve_workloads import ServeRequest
from mlxpa.bench.server_process import HOST, PeakRSS, ServerProcess, ServerStartError, free_port
from mlxpa.blas import child_blas_env, is_fast_blas


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
        mlx: The server runs on MLX, and gets this process's BLAS
            (:func:`~mlxpa.blas.child_blas_env`); else no fast BLAS is preloaded into it.
    """

    name: str
    argv: Callable[[str, int], list[str]]
    ignore_eos: bool
    model_name: str | None = None
    health_path: str = "/health"
    mlx: bool = True


def server_env(spec: ServerSpec) -> dict[str, str]:
    """The environment a started server gets on top of this one: an MLX server this
    process's BLAS; any other no OpenBLAS/MKL in ``LD_PRELOAD`` (mapped but unused, it would
    read as the server's BLAS)."""
    if spec.mlx:
        return child_blas_env()
    kept = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and not is_fast_blas(p)]
    return {"LD_PRELOAD": ":".join(kept)}


def mlxpa_serve_argv(model: str, port: int) -> list[str]:
    """``mlxpa serve --model M --host 127.0.0.1 --port P`` with this interpreter (the engine
    options of the bench are appended: :class:`ServeBench`'s ``server_args``)."""
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
    # the same server without --speculative-config: speculative decoding's A/B
    "mlxpa-nospec": ServerSpec("mlxpa-nospec", mlxpa_serve_argv, ignore_eos=True),
    "mlx-lm-server": ServerSpec("mlx-lm-server", mlx_lm_server_argv, ignore_eos=False,
                                model_name="default_model"),
}
SYSTEMS = (*SERVERS, OFFLINE)


@dataclass
class ServeRun:
    """The figures of one system at one load level (``load``: its label, or ``offline``) on
    one endpoint (``chat``, ``completions``, or None for a file's rows, which pick theirs)."""

    system: str
    load: str
    figures: dict = field(default_factory=dict)
    endpoint: str | None = None


@dataclass(frozen=True)
class Level:
    """One load level: how to send, the requests it sends, and their endpoint (None: mixed)."""

    spec: LoadSpec
    requests: list[ServeRequest]
    endpoint: str | None = None


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
    """Runs systems on load levels and collects :class:`ServeRun` s, what each system's
    process runs on (``systems``) and start failures (``failed``).

    Args:
        levels: The load levels, each with its requests.
        warmup: Requests sent before a server's first level (not measured); each must
            generate a token (:func:`~mlxpa.bench.serve_warmup.warm_up`).
        count_tokens: Tokens of a text (servers that send no usage).
        ignore_eos: Ask servers that take ``ignore_eos`` to ignore EOS.
        progress: Bars per measured run (None: none drawn).
        server_args: Arguments appended to a started server's command, by system name (the
            engine options of ``mlxpa serve``).
        offline_args: Engine settings of ``mlxpa-offline`` (:class:`~mlxpa.config.EngineConfig`
            fields).
    """

    def __init__(self, levels: list[Level], warmup: list[ServeRequest],
                 count_tokens: Callable[[str], int], ignore_eos: bool = True,
                 progress: BenchProgress | None = None,
                 server_args: dict[str, list[str]] | None = None,
                 offline_args: dict | None = None) -> None:
        self.levels, self.warmup, self.count_tokens = levels, warmup, count_tokens
        self.ignore_eos = ignore_eos
        self.progress = progress or BenchProgress(enabled=False)
        self.server_args, self.offline_args = server_args or {}, offline_args or {}
        self.runs: list[ServeRun] = []
        self.systems: dict[str, dict] = {}
        self.failed: dict[str, str] = {}

    def run_server(self, spec: ServerSpec, model: str, start_timeout_s: float = 300.0) -> None:
        """Start ``spec``'s server on ``model`` (a folder) with this process's BLAS, drive it
        at every level, stop it; a server that cannot start or answer is recorded in
        ``failed``."""
        base = f"http://{HOST}:{(port := free_port())}"
        argv = [*spec.argv(model, port), *self.server_args.get(spec.name, [])]
        try:
            with ServerProcess(argv, base, spec.health_path, start_timeout_s,
                               env=server_env(spec)) as server:
                self.drive(spec.name, base, spec.model_name or served_model(base),
                           self.ignore_eos and spec.ignore_eos, server.pid, start_timeout_s)
        except ServerStartError as e:
            self.failed[spec.name] = str(e)

    def drive(self, name: str, base_url: str, model_name: str, ignore_eos: bool,
              pid: int | None, warmup_timeout_s: float = 600.0) -> None:
        """Warm the server at ``base_url`` up until it generates tokens, record what its
        process runs on, then drive it at every level (``pid``: the server's process, whose
        maps, threads and tree's peak RSS are read; None: not read)."""
        record = {"url": base_url, "model": model_name, "ignore_eos": ignore_eos}
        if self.warmup:
            try:
                record["warmup"] = warm_up(base_url, self.warmup, model_name, ignore_eos,
                                           warmup_timeout_s)
            except WarmupError as e:
                self.failed[name] = str(e)
                return
        self.systems[name] = {**record, **process_record(pid)}
        for i, level in enumerate(self.levels):
            label = " ".join(filter(None, (level.endpoint, level.spec.label)))
            bar = self.progress.bar(f"{name} {label} [{i + 1}/{len(self.levels)}]",
                                    sum(r.max_tokens for r in level.requests))
            with PeakRSS(pid) as rss:
                load = drive(base_url, level.requests, level.spec, model_name, ignore_eos,
                             bar.advance)
            figures = load_figures(load, level.requests, self.count_tokens)
            figures["peak_rss_bytes"] = rss.peak_bytes
            bar.done(f"{figures['output_tokens_per_s']:.1f} out tok/s, "
                     f"{figures['failed']} failed")
            self.runs.append(ServeRun(name, level.spec.label, figures, level.endpoint))

    def run_offline(self, model: str | None) -> None:
        """``mlxpa-offline`` on each endpoint's first level (see
        :mod:`~mlxpa.bench.serve_offline`); a model that cannot load is recorded in
        ``failed``."""
        firsts: dict[str | None, Level] = {}
        for level in self.levels:
            firsts.setdefault(level.endpoint, level)
        for level in firsts.values():
            requests = level.requests
            bar = self.progress.bar(f"{OFFLINE} {level.endpoint or ''} (first level's "
                                    "requests, all at once)", sum(r.max_tokens for r in requests))
            try:
                figures = run_offline(model, requests, self.warmup, self.ignore_eos,
                                      bar.advance, **self.offline_args)
            except (FileNotFoundError, ValueError) as e:
                self.failed[OFFLINE] = str(e)
                bar.done("failed")
                return
            bar.done(f"{figures['output_tokens_per_s']:.1f} out tok/s")
            self.runs.append(ServeRun(OFFLINE, LOAD_LABEL, figures, level.endpoint))
        self.systems[OFFLINE] = {"engine": dict(self.offline_args),
                                 **process_record(os.getpid())}

    def run(self, systems: tuple[str, ...], model: str, start_timeout_s: float = 300.0,
            extra: dict[str, ServerSpec] | None = None) -> None:
        """Every system of ``systems`` (names of :data:`SYSTEMS` or of ``extra``'s specs) in
        order.

        Raises:
            ValueError: An unknown system name.
        """
        servers = {**SERVERS, **(extra or {})}
        unknown = [s for s in systems if s not in servers and s != OFFLINE]
        if unknown:
            raise ValueError(f"unknown system(s) {unknown}; choose from "
                             f"{', '.join([*servers, OFFLINE])}")
        for name in systems:
            if name == OFFLINE:
                self.run_offline(model)
            else:
                self.run_server(servers[name], model, start_timeout_s)
