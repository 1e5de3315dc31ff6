"""``mlxpa serve``: the OpenAI-compatible server (``mlxpa.entrypoints.openai``) on one model."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from mlxpa.cli import options as opt

SERVE_EXAMPLES = """\b
Examples:
  mlxpa serve                          # the default model on 127.0.0.1:8000
  mlxpa serve mlx-community/Qwen2.5-0.5B-Instruct-4bit --port 8001
  MLXPA_API_KEY=secret mlxpa serve --host 0.0.0.0 --max-num-waiting 64
  curl http://127.0.0.1:8000/v1/models
  curl http://127.0.0.1:8000/v1/chat/completions \\
      -H 'Content-Type: application/json' -d @request.json
"""

DEFAULT_MAX_NUM_WAITING = 512


@opt.engine_options(*opt.ENGINE_FLAGS)
def serve(
    model_path: Annotated[str | None, typer.Argument(
        metavar="MODEL", show_default=False,
        help="The model, as --model takes it (vLLM's `vllm serve MODEL`).")] = None,
    engine: dict | None = None,  # the engine options (ENGINE_FLAGS) stand here
    host: Annotated[str, typer.Option(
        help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    api_key: Annotated[str | None, typer.Option(
        envvar="MLXPA_API_KEY", show_envvar=True, show_default=False,
        help="Every /v1 route needs 'Authorization: Bearer KEY'.")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        show_default=False, help="The model's id in /v1/models and responses (default: "
        "the --model folder's name).")] = None,
    max_num_waiting: Annotated[int, typer.Option(
        help="Most requests waiting to run; more get 503 with Retry-After.")]
        = DEFAULT_MAX_NUM_WAITING,
    max_body_bytes: Annotated[int, typer.Option(
        help="Largest request body; larger gets 413.")] = 16 * 2**20,
    allowed_origins: Annotated[list[str] | None, typer.Option(
        show_default=False, metavar="URL,...", help="CORS origins allowed (repeatable or "
        "comma-separated; * any); default: no CORS.")] = None,
    timeout_graceful_shutdown: Annotated[float, typer.Option(
        help="Seconds SIGTERM lets requests in flight finish before they are cut.")] = 30.0,
    chat_template: opt.ChatTemplateOpt = None,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Serve the OpenAI API (chat and completions, streaming, /v1/models, /health, /metrics)
    on the engine; SIGTERM drains and exits 0."""
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    engine = dict(engine or {})
    if model_path is not None:
        if engine.get("model") is not None:
            raise typer.BadParameter(f"give the model once: MODEL ({model_path}) or --model "
                                     f"({engine['model']})")
        engine["model"] = model_path
    config = opt.checked_engine_config(engine)
    try:
        template = opt.read_chat_template(chat_template)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    origins = tuple(o.strip() for v in allowed_origins or () for o in v.split(",") if o.strip())
    _check(port, max_num_waiting, max_body_bytes, timeout_graceful_shutdown)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from mlxpa.batch.report import model_name
    from mlxpa.engine.async_llm import AsyncLLM
    from mlxpa.entrypoints.openai.app import ServerSettings, build_app
    from mlxpa.entrypoints.openai.server import run_server

    llm = AsyncLLM(config, max_num_waiting=max_num_waiting)
    try:
        llm.start()
    except (OSError, ValueError) as e:
        opt.fail(console, e, 1)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    try:
        settings = ServerSettings(served_model_name or model_name(config.model), api_key,
                                  max_body_bytes, origins, template)
        app = build_app(llm, settings)
        log = logging.getLogger("mlxpa")
        log.info("KV pool: %s; %s", pool_line(llm.engine),
                 llm.engine.runner.kv_storage.describe())
        log.info("Serving %s on http://%s:%d (OpenAI API under /v1); a request without "
                 "max_tokens may generate up to the rest of the %d-token context",
                 settings.served_model_name, host, port, llm.engine.max_model_len)
        run_server(app, host, port, timeout_graceful_shutdown)
    finally:
        llm.shutdown()


def pool_line(engine) -> str:
    """What the KV pool holds now and may grow to, for the start-up line: e.g. ``681 blocks
    (64.0 MiB) now, growing by segments of 682 blocks (--kv-segment-bytes) as requests need
    them up to 38,567 blocks (3.53 GiB, --kv-memory), back to one segment after 30 s without
    work (--kv-release-after)``."""
    pool, per = engine.kv_cache_manager.pool, engine.runner.kv_cache.block_nbytes

    def size(n: int) -> str:
        b = n * per
        return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:,.1f} MiB"

    def blocks(n: int) -> str:
        return f"{n:,} block{'' if n == 1 else 's'}"

    top = pool.max_num_blocks
    ceiling = f"{blocks(top - 1)} ({size(top)}, --kv-memory)"
    if pool.segment_blocks >= top:
        return f"{ceiling}, held with its prefix cache for the server's life"
    after = engine.config.kv_release_after
    release = (f"back to one segment after {after:g} s without work (--kv-release-after)"
               if after >= 0 else "kept once grown (--kv-release-after is negative)")
    return (f"{blocks(pool.num_usable_blocks)} ({size(pool.num_blocks)}) now, growing by "
            f"segments of {blocks(pool.segment_blocks)} (--kv-segment-bytes) as requests "
            f"need them up to {ceiling}, {release}")


def _check(port: int, max_num_waiting: int, max_body_bytes: int, timeout: float) -> None:
    """Usage errors (exit 2) for values out of range."""
    for ok, text in ((0 <= port <= 65535, f"--port must be from 0 to 65535, got {port}"),
                     (max_num_waiting >= 1, f"--max-num-waiting must be >= 1, got "
                      f"{max_num_waiting}"),
                     (max_body_bytes >= 1, f"--max-body-bytes must be >= 1, got "
                      f"{max_body_bytes}"),
                     (timeout >= 0, f"--timeout-graceful-shutdown must be >= 0, got {timeout}")):
        if not ok:
            raise typer.BadParameter(text)
