"""The ``mlxpa`` command line: thin Typer commands over library calls.

Heavy imports (mlx, mlx-lm, pyarrow) happen inside command bodies so ``mlxpa --help`` is
instant. Results go to stdout only when ``-o -`` (the default); progress and reports go to
stderr, so ``cat x.jsonl | mlxpa run - | jq ...`` works.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from mlxpa.cli.bench import BENCH_EXAMPLES, bench
from mlxpa.cli.bench_serve import SERVE_EXAMPLES
from mlxpa.cli.bench_serve import serve as bench_serve
from mlxpa.cli.cache import CACHE_EXAMPLES, cache_app
from mlxpa.cli.calibrate import CALIBRATE_EXAMPLES, calibrate
from mlxpa.cli.generate import GENERATE_EXAMPLES, generate
from mlxpa.cli.options import PlainUsageCommand, PlainUsageGroup
from mlxpa.cli.plan import plan
from mlxpa.cli.run import RUN_EXAMPLES, run
from mlxpa.cli.serve import SERVE_EXAMPLES as SERVER_EXAMPLES
from mlxpa.cli.serve import serve as serve_command

# Plain click help (no rich panels): it reads well at 80 columns, and flags get no metavar.
app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="Offline batch LLM inference on MLX with a paged KV cache.")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"mlxpa {version('mlxpa')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Offline batch LLM inference on MLX with a paged KV cache."""


# Short summaries: click cuts a docstring's first sentence with "..." at 80 columns.
app.command(epilog=RUN_EXAMPLES, cls=PlainUsageCommand,
            short_help="Generate a completion for every row of an input file.")(run)
app.command(epilog=GENERATE_EXAMPLES, cls=PlainUsageCommand,
            short_help="Print the completion of one prompt (as mlx_lm.generate).")(generate)
app.command(cls=PlainUsageCommand,
            short_help="Predict prefix sharing and KV blocks without the model.")(plan)
app.command("serve", epilog=SERVER_EXAMPLES, cls=PlainUsageCommand,
            short_help="Serve the OpenAI API (chat, completions, streaming).")(serve_command)
app.command(epilog=CALIBRATE_EXAMPLES, cls=PlainUsageCommand,
            short_help="Fit a calibration of questions' answers on labelled rows.")(calibrate)
# `mlxpa bench` runs the offline bench itself; `mlxpa bench serve` is its command for servers.
bench_app = typer.Typer(add_completion=False, rich_markup_mode=None,
                        pretty_exceptions_enable=False)
bench_app.callback(cls=PlainUsageGroup, invoke_without_command=True, epilog=BENCH_EXAMPLES,
                   subcommand_metavar="[COMMAND [ARGS]...]")(bench)
bench_app.command("serve", epilog=SERVE_EXAMPLES, cls=PlainUsageCommand,
                  short_help="Drive OpenAI-compatible servers with streaming clients.")(bench_serve)
app.add_typer(bench_app, name="bench",
              short_help="Time mlxpa against mlx-lm and static allocation.")
app.add_typer(cache_app, name="cache", epilog=CACHE_EXAMPLES,
              short_help="List or clear the disk KV cache (--kv-cache-dir).")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main() -> None:
    """Console entry point: pick a fast BLAS on Linux, then run the Typer app."""
    import os

    from mlxpa.blas import BLAS_MODES, argv_blas_mode, maybe_reexec

    # transformers' tokenizer warns about prompts longer than its model_max_length; mlxpa
    # checks lengths itself and reports them per row.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    mode = argv_blas_mode(sys.argv[1:])
    if mode not in BLAS_MODES:
        print(f"error: --blas must be one of {', '.join(BLAS_MODES)}, got {mode!r}",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        hint = maybe_reexec(mode)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if hint and len(sys.argv) > 1 and sys.argv[1] in ("run", "bench", "serve", "calibrate",
                                                         "generate"):
        print(hint, file=sys.stderr)
    import warnings

    warnings.showwarning = _show_warning
    app(prog_name="mlxpa")
