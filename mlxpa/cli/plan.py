"""``mlxpa plan``: predicted prefix sharing of an input file, without running the model."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxpa.cli.options import (
    BlasOpt,
    IdColumnOpt,
    InputFormat,
    InputFormatOpt,
    MessagesColumnOpt,
    PromptColumnOpt,
    SystemOpt,
    checked_engine_config,
    engine_options,
    fail,
    flag_message,
    input_options,
)

# The engine options a plan reads (the KV figures need the model's geometry, not its weights;
# the disk tier's blocks, what names them: the adapter, the attention kernels).
PLAN_ENGINE = ("model", "revision", "adapter_path", "dtype", "block_size", "max_model_len",
               "kv_cache_dtype", "kv_group_size", "kv_cache_memory_bytes", "kv_cache_dir",
               "attention_backend")


@engine_options(*PLAN_ENGINE)
def plan(
    input: Annotated[str, typer.Argument(
        help="Prompts: as for mlxpa run (.jsonl, .json, .csv, .tsv, .txt, .parquet, a "
        "datasets folder, or -).")],
    engine: dict | None = None,  # the engine options (PLAN_ENGINE) stand here
    max_tokens: Annotated[int, typer.Option(
        help="Output tokens of a row that does not set max_tokens (KV estimate).")] = 256,
    top: Annotated[int, typer.Option(min=0, help="Shared prefixes to list.")] = 5,
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
    --kv-cache-dtype, the longest shared prefixes. With --kv-cache-dir, hits also continue
    over the blocks a run would read from that disk tier, counted by tier. Invalid rows are
    listed as run lists them (exit 2); rows over the context are named."""
    import json

    from rich.console import Console

    from mlxpa.batch.model_meta import ModelMeta
    from mlxpa.batch.plan import plan_file, plan_tables
    from mlxpa.batch.source import Source
    from mlxpa.batch.validation import validate_input
    from mlxpa.data import InputError

    console = Console(stderr=True)
    config = checked_engine_config(engine)
    try:
        inputs = input_options(input_format, prompt_column, messages_column, id_column, system)
        defaults, options = _plan_settings(max_tokens, skip_invalid)
        meta = ModelMeta(config)
        kv, why = _kv_plan(config)
        disk = _disk_lookup(config, kv, why, console)
        with Source.open(input, inputs) as src:  # the tokenizer loads when a row needs it
            v = validate_input(
                src, None, defaults, options, console, vocab_size=meta.vocab_size(),
                tokenizer=meta.tokenizer,
                refusal="nothing was planned (--skip-invalid plans the rest)").validation
            p = plan_file(src, v, meta.tokenizer(), defaults, block_size=config.block_size,
                          top_k=top, max_model_len=meta.context_len(), disk=disk,
                          kv_cache_dir=config.kv_cache_dir if disk else None)
    except InputError as e:
        fail(console, e, 2)
    except (FileNotFoundError, ValueError) as e:
        fail(console, e, 1)
    if p.over_context_rows:
        shown = "".join(f"\n  {line}" for line in p.over_context)
        console.print(f"warning: {p.over_context_rows} row(s) over the context (run writes an "
                      f"error row for each; not planned):{shown}", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)
    if why:
        console.print(f"warning: no KV memory figures: {why}", style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
    if json_out:
        kv_dict = {"kv_cache": kv.to_dict(p)} if kv else {}
        print(json.dumps({**p.to_dict(), **kv_dict}, indent=2, ensure_ascii=False))
        return
    out = Console()
    for table in plan_tables(p, f"mlxpa plan: {input}"):
        out.print(table)
    for line in kv.lines(p) if kv else ():
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _kv_plan(config):
    """``(KVPlan, None)``, or ``(None, why)`` when the model's cache geometry cannot be
    traced (the rest of the plan needs only the tokenizer)."""
    from mlxpa.batch.plan import plan_kv

    try:
        return plan_kv(config), None
    except Exception as e:  # noqa: BLE001 - the prefix figures stand without the KV ones
        return None, f"{type(e).__name__}: {e}"


def _disk_lookup(config, kv, why: str | None, console):
    """The disk tier's lookup for ``--kv-cache-dir`` (None without it, or, with a warning,
    when the model's identity cannot be computed)."""
    from mlxpa.batch.plan import disk_lookup

    if config.kv_cache_dir is None:
        return None
    problem = why
    if kv is not None:
        try:
            return disk_lookup(config, kv)
        except OSError as e:
            problem = f"{e.strerror or e}: {e.filename}"
    console.print(f"warning: no disk KV tier figures: {problem}", style="yellow",
                  markup=False, highlight=False, soft_wrap=True)
    return None


def _plan_settings(max_tokens: int, skip_invalid: bool):
    """The sampling defaults and run options a plan reads the input with.

    Raises:
        typer.BadParameter: ``--max-tokens`` out of range, named.
    """
    from mlxpa.batch.options import RunOptions
    from mlxpa.sampling_params import SamplingParams

    try:
        defaults = SamplingParams(max_tokens=max_tokens)
    except ValueError as e:
        raise typer.BadParameter(flag_message(e)) from None
    return defaults, RunOptions(skip_invalid=skip_invalid, show_progress=False)
