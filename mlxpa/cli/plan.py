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
    KVCacheDtype,
    KVCacheDtypeOpt,
    KVGroupSizeOpt,
    KVMemoryOpt,
    MaxModelLenOpt,
    MessagesColumnOpt,
    ModelOpt,
    PromptColumnOpt,
    SystemOpt,
    fail,
    input_options,
)


def plan(
    input: Annotated[str, typer.Argument(
        help="Prompts: as for mlxpa run (.jsonl, .json, .csv, .tsv, .txt, .parquet, a "
        "datasets folder, or -).")],
    model: ModelOpt = None,
    block_size: BlockSizeOpt = 16,
    max_tokens: Annotated[int, typer.Option(
        help="Output tokens of a row that does not set max_tokens (KV estimate).")] = 256,
    max_model_len: MaxModelLenOpt = None,
    kv_cache_dtype: KVCacheDtypeOpt = KVCacheDtype.auto,
    kv_group_size: KVGroupSizeOpt = 64,
    kv_memory: KVMemoryOpt = None,
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
    sharing, hit rate, KV blocks with and without sharing and their memory in the chosen
    --kv-cache-dtype, the longest shared prefixes. Invalid rows are listed as run lists them
    (exit 2); rows over the context are named."""
    import json

    from rich.console import Console

    from mlxpa.data import InputError
    from mlxpa.plan import plan_file
    from mlxpa.progress import plan_tables

    console = Console(stderr=True)
    try:
        inputs = input_options(input_format, prompt_column, messages_column, id_column, system)
        tokenizer, context = _tokenizer_and_context(model, max_model_len)
        with _checked_input(input, inputs, max_tokens, skip_invalid, tokenizer) as (
                path, inputs, name, v):
            p = plan_file(path, tokenizer, inputs=inputs, block_size=block_size,
                          max_tokens=max_tokens, top_k=top, max_model_len=context,
                          invalid=v.row_problems, name=name)
        kv, why = _kv_plan(model, block_size, kv_cache_dtype.value, kv_group_size, kv_memory)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
    if p.over_context_rows:
        shown = "".join(f"\n  {line}" for line in p.over_context)
        console.print(f"warning: {p.over_context_rows} row(s) over the context (run writes an "
                      f"error row for each; not planned):{shown}", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)
    blocks = p.kv_blocks_without_sharing, p.kv_blocks_with_sharing
    if why:
        console.print(f"warning: no KV memory figures: {why}", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
    if json_out:
        kv_dict = {"kv_cache": kv.to_dict(*blocks)} if kv else {}
        print(json.dumps({**p.to_dict(), **kv_dict}, indent=2, ensure_ascii=False))
        return
    out = Console()
    for table in plan_tables(p, f"mlxpa plan: {input}"):
        out.print(table)
    for line in kv.lines(*blocks) if kv else ():
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _kv_plan(model: str | None, block_size: int, kv_cache_dtype: str, kv_group_size: int,
             kv_memory: float | None):
    """``(KVPlan, None)``, or ``(None, why)`` when the model's cache geometry cannot be
    traced (the rest of the plan needs only the tokenizer).

    Raises:
        ValueError: An option out of range (``--kv-group-size``, ``--kv-memory``).
    """
    from mlxpa.config import EngineConfig
    from mlxpa.worker.kv_plan import plan_kv

    EngineConfig(kv_memory_gib=kv_memory, kv_group_size=kv_group_size)  # the options' errors
    try:
        return plan_kv(model, block_size, kv_cache_dtype, kv_group_size, kv_memory), None
    except Exception as e:  # noqa: BLE001 - the prefix figures stand without the KV ones
        return None, f"{type(e).__name__}: {e}"


def _tokenizer_and_context(model: str | None, max_model_len: int | None):
    """The model's tokenizer (no weights) and its context capped by ``--max-model-len``.

    Raises:
        FileNotFoundError, ValueError: The model cannot be found or read.
    """
    from mlx_lm.utils import load_tokenizer

    from mlxpa.loader.models import peek_context_len, resolve_model

    if max_model_len is not None and max_model_len < 2:
        raise ValueError(f"--max-model-len must be >= 2 (a prompt token and an output "
                         f"token), got {max_model_len}")
    tokenizer = load_tokenizer(resolve_model(model))
    ctx = peek_context_len(model)
    return tokenizer, min(filter(None, (ctx, max_model_len)), default=None)


@contextlib.contextmanager
def _checked_input(source: str, inputs, max_tokens: int, skip_invalid: bool, tokenizer):
    """The input checked as ``run`` checks it, chat rows against the template (stdin spooled
    to a file, since it is read twice): yields ``(path, inputs, name, validation)`` with the
    format decided.

    Raises:
        InputError: Invalid rows (the first 20 listed), unless ``skip_invalid``.
    """
    import dataclasses
    import os

    from mlxpa.config import SamplingParams
    from mlxpa.data import STDIN, input_format, read_rows, spool_stdin
    from mlxpa.data.read import LINE_FORMATS
    from mlxpa.data.validate import check, validate
    from mlxpa.prompts import messages_checker

    fmt = input_format(source, inputs.fmt)
    spooled = source == STDIN and fmt != "hf"
    path = spool_stdin(fmt) if spooled else source
    name = "<stdin>" if spooled else source
    inputs = dataclasses.replace(inputs, fmt=fmt)
    try:
        v = validate(read_rows(path, inputs, name=name), source=name,
                     unit="line" if fmt in LINE_FORMATS else "row",
                     defaults=SamplingParams(max_tokens=max_tokens),
                     check_prompt=messages_checker(lambda: tokenizer))
        if not skip_invalid:
            check(v, name, "nothing was planned (--skip-invalid plans the rest)")
        yield path, inputs, name, v
    finally:
        if spooled:
            os.remove(path)
