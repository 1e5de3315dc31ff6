"""``mlxpa plan``: predicted prefix sharing of an input file, without running the model."""

from __future__ import annotations

import contextlib
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
    skip_invalid: Annotated[bool, typer.Option(
        "--skip-invalid", help="Plan the valid rows and count the rest (default: list the "
        "first 20 problems, as run does, and exit 2).")] = False,
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
        with _checked_input(input, inputs, max_tokens, skip_invalid) as (path, inputs):
            tokenizer = load_tokenizer(resolve_model(model))
            p = plan_file(path, tokenizer, inputs=inputs, block_size=block_size,
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


@contextlib.contextmanager
def _checked_input(source: str, inputs, max_tokens: int, skip_invalid: bool):
    """The input checked as ``run`` checks it (stdin spooled to a file, since it is read
    twice): yields ``(path, inputs)`` with the format decided.

    Raises:
        InputError: Invalid rows (the first 20 listed), unless ``skip_invalid``.
    """
    import dataclasses
    import os

    from mlxpa.config import SamplingParams
    from mlxpa.data import STDIN, input_format, read_rows, spool_stdin
    from mlxpa.data.read import LINE_FORMATS
    from mlxpa.data.validate import check, validate

    fmt = input_format(source, inputs.fmt)
    spooled = source == STDIN and fmt != "hf"
    path = spool_stdin(fmt) if spooled else source
    name = "<stdin>" if spooled else source
    inputs = dataclasses.replace(inputs, fmt=fmt)
    try:
        v = validate(read_rows(path, inputs, name=name), source=name,
                     unit="line" if fmt in LINE_FORMATS else "row",
                     defaults=SamplingParams(max_tokens=max_tokens))
        if not skip_invalid:
            check(v, name)
        yield path, inputs
    finally:
        if spooled:
            os.remove(path)
