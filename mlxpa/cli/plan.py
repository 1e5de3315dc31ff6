"""``mlxpa plan``: predicted prefix sharing of an input file, without running the model."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxpa.cli.options import BlasOpt, BlockSizeOpt, ModelOpt, fail


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
    from mlxpa.loader.models import resolve_model
    from mlxpa.plan import plan_file

    console = Console(stderr=True)
    try:
        tokenizer = load_tokenizer(resolve_model(model))
        p = plan_file(input, tokenizer, block_size=block_size, max_tokens=max_tokens,
                      top_k=top, prompt_column=prompt_column,
                      messages_column=messages_column, id_column=id_column)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
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
