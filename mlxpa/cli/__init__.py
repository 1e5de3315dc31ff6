"""The ``mlxpa`` command line: thin Typer commands over library calls.

Heavy imports (mlx, mlx-lm, pyarrow) happen inside command bodies so ``mlxpa --help`` is
instant. Results go to stdout only when ``-o -`` (the default); progress and reports go to
stderr, so ``cat x.jsonl | mlxpa run - | jq ...`` works.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from mlxpa.cli.bench import BENCH_EXAMPLES, bench
from mlxpa.cli.options import (
    BlasOpt,
    BlockSizeOpt,
    KernelOpt,
    KVMemoryOpt,
    MaxBatchedOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    fail,
)
from mlxpa.cli.plan import plan

app = typer.Typer(no_args_is_help=True, add_completion=False,
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


RUN_EXAMPLES = """
Examples:

  mlxpa run examples/prompts.jsonl -o out.jsonl

  mlxpa run prompts.parquet -o out.parquet --max-tokens 64 --temperature 0.7 --seed 1

  mlxpa run batch_input.jsonl -o batch_output.jsonl   # OpenAI Batch lines in and out

  mlxpa run data.csv -o out.jsonl --prompt-column question --keep-columns category

  mlxpa run prompts.jsonl -o out.jsonl --resume       # after a crash or Ctrl-C

  cat x.jsonl | mlxpa run - | jq -r .text
"""


@app.command(epilog=RUN_EXAMPLES)
def run(
    input: Annotated[str, typer.Argument(
        help="Prompts: .jsonl, .parquet, .csv, a Hugging Face datasets folder, or - (stdin).")],
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Results: .jsonl or .parquet, or - (stdout, JSONL).")] = "-",
    model: ModelOpt = None,
    max_tokens: Annotated[int, typer.Option(
        help="Default completion length cap (clamped to the context).")] = 256,
    temperature: Annotated[float, typer.Option(help="Default temperature; 0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Default nucleus mass.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Default top-k (0 = off).")] = 0,
    min_p: Annotated[float, typer.Option(help="Default min-p (0 = off).")] = 0.0,
    seed: Annotated[int, typer.Option(
        help="Engine seed: a row without a seed field samples with a seed derived from this "
        "and its row index (vLLM's LLM(seed=...)).")] = 0,
    n: Annotated[int, typer.Option("--n", help="Default samples per prompt.")] = 1,
    stop: Annotated[list[str] | None, typer.Option(
        help="Default stop string (repeatable; the earliest match ends the text).")] = None,
    stop_token_id: Annotated[list[int] | None, typer.Option(
        help="Default token id that ends the completion like EOS (repeatable).")] = None,
    min_tokens: Annotated[int, typer.Option(
        help="Default tokens to generate before EOS or a stop may end the completion.")] = 0,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos", help="Default: generate past EOS up to max tokens.")] = False,
    include_stop_str: Annotated[bool, typer.Option(
        "--include-stop-str", help="Default: keep the matched stop string in the text.")
    ] = False,
    system: Annotated[str | None, typer.Option(
        help="System message put first: a system turn before chat messages (unless they "
        "start with one), or text and a blank line before a text prompt.")] = None,
    split_special_tokens: Annotated[bool, typer.Option(
        "--split-special-tokens", help="Tokenize control-token text (<eos>, "
        "<start_of_turn>, ...) in text prompts as ordinary text too; chat messages always "
        "are (only the chat template inserts control tokens).")] = False,
    input_format: Annotated[str, typer.Option(
        help="auto (by extension; a folder is a datasets folder), jsonl, parquet, csv, or hf "
        "(through the datasets library).")] = "auto",
    output_format: Annotated[str, typer.Option(
        help="auto, mlxpa (a row per sample) or openai (Batch API output lines; the default "
        "when every input line is an OpenAI Batch request and the output is JSONL).")
    ] = "auto",
    prompt_column: Annotated[str, typer.Option(help="Field with the text prompt.")] = "prompt",
    messages_column: Annotated[str, typer.Option(help="Field with chat messages.")] = "messages",
    id_column: Annotated[str, typer.Option(help="Field with the row id.")] = "id",
    keep_columns: Annotated[list[str] | None, typer.Option(
        help="Input fields to copy into every output row (repeatable or comma-separated).")
    ] = None,
    skip_invalid: Annotated[bool, typer.Option(
        "--skip-invalid", help="Write an error row for each invalid row and run the rest "
        "(default: list the first 20 problems and stop before loading the model).")] = False,
    unordered: Annotated[bool, typer.Option(
        "--unordered", help="Write rows as they finish, not in input order.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Keep the rows already in the output, skip their ids, append the "
        "rest (a torn last line is cut off).")] = False,
    block_size: BlockSizeOpt = 16,
    kv_memory: KVMemoryOpt = None,
    max_num_seqs: MaxNumSeqsOpt = 128,
    max_num_batched_tokens: MaxBatchedOpt = 2048,
    max_model_len: MaxModelLenOpt = None,
    kernel: KernelOpt = "auto",
    order: Annotated[str, typer.Option(
        help="Admission order: prefix (each window of 4096 rows read is ordered so rows "
        "sharing a prefix run together) or input. Output order is not affected.")
    ] = "prefix",
    prefix_caching: Annotated[bool, typer.Option(
        "--prefix-caching/--no-prefix-caching",
        help="Share cached prompt prefixes across rows (radix tree).")] = True,
    metrics_json: Annotated[str | None, typer.Option(
        help="Write the final statistics as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress bar or report.")] = False,
    blas: BlasOpt = "auto",
) -> None:
    """Generate a completion for every row of INPUT; one result row per input row, in order.

    Ctrl-C stops admitting rows, writes every finished row, prints the command that resumes
    the run, and exits with status 130 (a second Ctrl-C quits at once; the output stays
    valid).
    """
    from rich.console import Console

    from mlxpa.config import EngineConfig, SamplingParams
    from mlxpa.data import InputError, InputOptions
    from mlxpa.data.records import OUTPUT_FORMATS
    from mlxpa.data.resume import resume_hint
    from mlxpa.run import run_file
    from mlxpa.run_signals import catch_sigint

    console = Console(stderr=True)
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    keep = tuple(c.strip() for k in keep_columns or () for c in k.split(",") if c.strip())
    try:
        config = EngineConfig(model=model, block_size=block_size, kv_memory_gib=kv_memory,
                              max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              max_model_len=max_model_len, kernel=kernel,
                              enable_prefix_caching=prefix_caching, seed=seed)
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                  top_k=top_k, min_p=min_p, stop=tuple(stop or ()),
                                  n=n, ignore_eos=ignore_eos,
                                  stop_token_ids=tuple(stop_token_id or ()),
                                  include_stop_str_in_output=include_stop_str,
                                  min_tokens=min_tokens)
        if order not in ("prefix", "input"):
            raise ValueError(f"order must be prefix or input, got {order!r}")
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}, "
                             f"got {output_format!r}")
        if resume and output == "-":
            raise ValueError("--resume needs an output file (-o PATH), not stdout")
        if _same_file(input, output):
            raise ValueError(f"the output {output} is the input file; writing it would "
                             "destroy the input")
        inputs = InputOptions(None if input_format == "auto" else input_format, prompt_column,
                              messages_column, id_column, system, keep,
                              split_special_tokens)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    with catch_sigint() as interrupted:
        try:
            run_file(input, output, config, defaults, inputs=inputs, output_fmt=output_format,
                     order=order, ordered=not unordered, skip_invalid=skip_invalid,
                     resume=resume, metrics_json=metrics_json, console=console,
                     show_progress=not quiet, should_stop=interrupted.is_set)
        except InputError as e:
            fail(console, e, 2)
        except BrokenPipeError:
            sys.stderr.close()
            raise typer.Exit(0) from None
        except (OSError, ValueError) as e:
            fail(console, e, 1)
        except KeyboardInterrupt:
            interrupted.set()
    if interrupted.is_set():
        console.print(resume_hint(input, output, sys.argv), markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130)


def _same_file(a: str, b: str) -> bool:
    import os

    try:
        return a != "-" and b != "-" and os.path.samefile(a, b)
    except OSError:
        return False


app.command()(plan)
app.command(epilog=BENCH_EXAMPLES)(bench)


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
    if hint and len(sys.argv) > 1 and sys.argv[1] in ("run", "bench"):
        print(hint, file=sys.stderr)
    import warnings

    warnings.showwarning = _show_warning
    app(prog_name="mlxpa")
