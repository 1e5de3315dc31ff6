"""``mlxpa plan``: predicted prefix sharing of an input file, without running the model."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxpa.cli.options import (
    BlasOpt,
    BlockSizeOpt,
    IdColumnOpt,
    InputFormat,
    InputFormatOpt,
    MessagesColumnOpt,
    ModelOpt,
    PromptColumnOpt,
    SystemOpt,
    fail,
    input_options,
)


def plan(
    input: Annotated[str, typer.Argument(
        help="Prompts: .jsonl, .parquet, .csv, a Hugging Face datasets folder, or -.")],
    model: ModelOpt = None,
    block_size: BlockSizeOpt = 16,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per row (KV estimate).")] = 256,
    top: Annotated[int, typer.Option(help="Shared prefixes to list.")] = 5,
    system: SystemOpt = None,
    input_format: InputFormatOpt = InputFormat.auto,
    prompt_column: PromptColumnOpt = "prompt",
    messages_column: MessagesColumnOpt = "messages",
    id_column: IdColumnOpt = "id",
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    blas: BlasOpt = "auto",
) -> None:
    """Predict prefix sharing without running the model: prompt tokens, tokens after
    sharing, hit rate, KV blocks with and without sharing, the longest shared prefixes."""
    import json

    from mlx_lm.utils import load_tokenizer
    from rich.console import Console

    from mlxpa.data import InputError
    from mlxpa.loader.models import resolve_model
    from mlxpa.plan import plan_file
    from mlxpa.progress import plan_tables

    console = Console(stderr=True)
    try:
        inputs = input_options(input_format, prompt_column, messages_column, id_column, system)
        tokenizer = load_tokenizer(resolve_model(model))
        p = plan_file(input, tokenizer, inputs=inputs, block_size=block_size,
                      max_tokens=max_tokens, top_k=top)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
    if json_out:
        print(json.dumps(p.to_dict(), indent=2, ensure_ascii=False))
        return
    out = Console()
    for table in plan_tables(p, f"mlxpa plan: {input}"):
        out.print(table)
