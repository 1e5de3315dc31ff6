"""Options shared by the ``mlxpa`` commands (Typer annotations) and the error exit."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from typer.core import TyperCommand

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", metavar="MODEL",
        help="MLX model folder, a Hugging Face repo id in the local cache, or a "
    ".gguf file. Default: Gemma 3 270M (converted once from the packaged GGUF).")]
BlockSizeOpt = Annotated[int, typer.Option(metavar="N", help="Tokens per KV block.")]
KVMemoryOpt = Annotated[float | None, typer.Option(
    "--kv-memory", metavar="GIB",
    help="Most memory for the KV pool in GiB (default: 15% of memory, at most 4); the pool "
    "takes only what the input can use.")]
MaxNumSeqsOpt = Annotated[int, typer.Option(metavar="N", help="Most requests decoding at once.")]
MaxBatchedOpt = Annotated[int, typer.Option(
    metavar="N",
    help="Token budget of one step (prefill chunks + decodes); longer prompts are chunked.")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    metavar="N", help="Longest prompt + completion in tokens (default: the model's context).")]
KernelOpt = Annotated[str, typer.Option(metavar="NAME",
    help="Paged attention: auto, reference, cpu, metal, cuda.")]
BlasOpt = Annotated[str, typer.Option(
    metavar="auto|system|bundled",
    help="Linux CPU: auto (re-run with an installed OpenBLAS/MKL), system, bundled.")]


class PlainUsageCommand(TyperCommand):
    """A Typer command whose help reads as click's: usage ``INPUT``, not ``{INPUT}``, and
    arguments show no ``<str>`` type (options name theirs with ``metavar``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:  # Typer vendors click: its classes are not click's
            if p.param_type_name == "argument":
                p.display_type_rich = lambda ctx: None  # type: ignore[method-assign]

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


def fail(console, error: Exception, code: int) -> NoReturn:
    """Print ``error`` on stderr unwrapped and without markup, then exit with ``code``."""
    console.print(f"error: {error}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


