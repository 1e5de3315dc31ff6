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

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Offline batch LLM inference on MLX with a paged KV cache.")

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="MLX model folder, a Hugging Face repo id in the local cache, or a "
    ".gguf file. Default: Gemma 3 270M (converted once from the packaged GGUF).")]
BlockSizeOpt = Annotated[int, typer.Option(help="Tokens per KV block.")]
KVMemoryOpt = Annotated[float, typer.Option("--kv-memory", help="KV pool size in GiB.")]
MaxNumSeqsOpt = Annotated[int, typer.Option(help="Most requests decoding at once.")]
MaxBatchedOpt = Annotated[int, typer.Option(
    help="Token budget of one step (prefill chunks + decodes); longer prompts are chunked.")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    help="Longest prompt + completion in tokens (default: the model's context).")]
KernelOpt = Annotated[str, typer.Option(help="Paged attention: auto, reference, metal, cuda.")]
BlasOpt = Annotated[str, typer.Option(
    help="Linux CPU: auto (re-run with an installed OpenBLAS/MKL), system, bundled.")]

@app.callback()
def _root() -> None:
    """Offline batch LLM inference on MLX with a paged KV cache."""


RUN_EXAMPLES = """
Examples:

  mlxpa run examples/prompts.jsonl -o out.jsonl

  mlxpa run prompts.parquet -o out.parquet --max-tokens 64 --temperature 0.7 --seed 1

  cat x.jsonl | mlxpa run - | jq -r .text
"""


@app.command(epilog=RUN_EXAMPLES)
def run(
    input: Annotated[str, typer.Argument(help="Prompts: .jsonl or .parquet file, or - (stdin).")],
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Results: .jsonl or .parquet, or - (stdout, JSONL).")] = "-",
    model: ModelOpt = None,
    max_tokens: Annotated[int, typer.Option(help="Default completion length cap.")] = 256,
    temperature: Annotated[float, typer.Option(help="Default temperature; 0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Default nucleus mass.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Default top-k (0 = off).")] = 0,
    min_p: Annotated[float, typer.Option(help="Default min-p (0 = off).")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Default per-row seed.")] = None,
    n: Annotated[int, typer.Option("--n", help="Default samples per prompt.")] = 1,
    stop: Annotated[list[str] | None, typer.Option(
        help="Default stop string (repeatable).")] = None,
    prompt_column: Annotated[str, typer.Option(help="Field with the text prompt.")] = "prompt",
    messages_column: Annotated[str, typer.Option(help="Field with chat messages.")] = "messages",
    id_column: Annotated[str, typer.Option(help="Field with the row id.")] = "id",
    block_size: BlockSizeOpt = 16,
    kv_memory: KVMemoryOpt = 1.0,
    max_num_seqs: MaxNumSeqsOpt = 64,
    max_num_batched_tokens: MaxBatchedOpt = 2048,
    max_model_len: MaxModelLenOpt = None,
    kernel: KernelOpt = "auto",
    order: Annotated[str, typer.Option(
        help="Admission order: prefix (rows sharing a prefix run together) or input.")
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
    """Generate a completion for every row of INPUT; one result row per input row, in order."""
    from rich.console import Console

    from mlxpa.config import EngineConfig, SamplingParams
    from mlxpa.data import InputError
    from mlxpa.run import run_file

    console = Console(stderr=True)
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        config = EngineConfig(model=model, block_size=block_size, kv_memory_gib=kv_memory,
                              max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              max_model_len=max_model_len, kernel=kernel,
                              enable_prefix_caching=prefix_caching)
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                  top_k=top_k, min_p=min_p, seed=seed, stop=tuple(stop or ()),
                                  n=n)
        if order not in ("prefix", "input"):
            raise ValueError(f"order must be prefix or input, got {order!r}")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    try:
        run_file(input, output, config, defaults, prompt_column=prompt_column,
                 messages_column=messages_column, id_column=id_column, order=order,
                 metrics_json=metrics_json, console=console, show_progress=not quiet)
    except InputError as e:
        _fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        _fail(console, e, 1)
    except BrokenPipeError:
        sys.stderr.close()
        raise typer.Exit(0) from None


@app.command()
def plan(
    input: Annotated[str, typer.Argument(help="Prompts: .jsonl or .parquet file, or -.")],
    model: ModelOpt = None,
    block_size: BlockSizeOpt = 16,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per row (KV estimate).")] = 256,
    top: Annotated[int, typer.Option(help="Shared prefixes to list.")] = 5,
    prompt_column: Annotated[str, typer.Option(help="Field with the text prompt.")] = "prompt",
    messages_column: Annotated[str, typer.Option(help="Field with chat messages.")] = "messages",
    id_column: Annotated[str, typer.Option(help="Field with the row id.")] = "id",
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    blas: BlasOpt = "auto",
) -> None:
    """Predict prefix sharing without running the model: prompt tokens, tokens after
    sharing, hit rate, KV blocks with and without sharing, the longest shared prefixes."""
    import json

    from mlx_lm.utils import load_tokenizer
    from rich.console import Console
    from rich.table import Table

    from mlxpa.data import InputError
    from mlxpa.models import resolve_model
    from mlxpa.plan import plan_file

    console = Console(stderr=True)
    try:
        tokenizer = load_tokenizer(resolve_model(model))
        p = plan_file(input, tokenizer, block_size=block_size, max_tokens=max_tokens,
                      top_k=top, prompt_column=prompt_column,
                      messages_column=messages_column, id_column=id_column)
    except InputError as e:
        _fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        _fail(console, e, 1)
    if json_out:
        print(json.dumps(p.to_dict(), indent=2, ensure_ascii=False))
        return
    out = Console()
    t = Table(title=f"mlxpa plan: {input}", show_header=False, box=None)
    for k, v in [("rows", f"{p.rows} (+{p.invalid_rows} invalid)"),
                 ("prompt tokens", f"{p.prompt_tokens}"),
                 ("tokens after sharing", f"{p.computed_prompt_tokens}"),
                 ("predicted prefix cache hit rate", f"{p.predicted_hit_rate:.1%}"),
                 ("KV blocks without sharing", f"{p.kv_blocks_without_sharing}"),
                 ("KV blocks with sharing", f"{p.kv_blocks_with_sharing}"),
                 ("block size", f"{p.block_size}")]:
        t.add_row(f"[bold]{k}", v)
    out.print(t)
    s = Table(title="longest shared prefixes")
    for col in ("tokens", "rows", "first row", "starts with"):
        s.add_column(col)
    for sp in p.shared_prefixes:
        s.add_row(str(sp.num_tokens), str(sp.num_rows), str(sp.first_row_id), repr(sp.preview))
    out.print(s)


def _fail(console, error: Exception, code: int) -> None:
    """Print ``error`` on stderr unwrapped and without markup, then exit with ``code``."""
    console.print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


def main() -> None:
    """Console entry point: pick a fast BLAS on Linux, then run the Typer app."""
    from mlxpa.blas import argv_blas_mode, maybe_reexec

    try:
        hint = maybe_reexec(argv_blas_mode(sys.argv[1:]))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if hint and len(sys.argv) > 1 and sys.argv[1] in ("run", "bench"):
        print(hint, file=sys.stderr)
    app(prog_name="mlxpa")
