"""Options shared by the ``mlxpa`` commands (Typer annotations) and the error exit."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="MLX model folder, a Hugging Face repo id in the local cache, or a "
    ".gguf file. Default: Gemma 3 270M (converted once from the packaged GGUF).")]
BlockSizeOpt = Annotated[int, typer.Option(help="Tokens per KV block.")]
KVMemoryOpt = Annotated[float | None, typer.Option(
    "--kv-memory", help="KV pool size in GiB (default: 15% of memory, at most 4).")]
MaxNumSeqsOpt = Annotated[int, typer.Option(help="Most requests decoding at once.")]
MaxBatchedOpt = Annotated[int, typer.Option(
    help="Token budget of one step (prefill chunks + decodes); longer prompts are chunked.")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    help="Longest prompt + completion in tokens (default: the model's context).")]
KernelOpt = Annotated[str, typer.Option(help="Paged attention: auto, reference, cpu, metal, cuda.")]
BlasOpt = Annotated[str, typer.Option(
    help="Linux CPU: auto (re-run with an installed OpenBLAS/MKL), system, bundled.")]


def fail(console, error: Exception, code: int) -> NoReturn:
    """Print ``error`` on stderr unwrapped and without markup, then exit with ``code``."""
    console.print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


