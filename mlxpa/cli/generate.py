"""``mlxpa generate``: one prompt's completion printed, as ``mlx_lm.generate --prompt`` does,
on the engine and with the sampling options of ``mlxpa run``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from mlxpa.cli import options as opt

GENERATE_EXAMPLES = """\b
Examples:
  mlxpa generate --prompt 'Question: What is the capital of France?\\nAnswer:'
  mlxpa generate -p 'Write a haiku.' --chat --temperature 0.7 --seed 1 \\
      --model mlx-community/Qwen2.5-0.5B-Instruct-4bit
  echo 'Once upon a time' | mlxpa generate -p -
"""


@opt.engine_options(*(f for f in opt.ENGINE_FLAGS if f not in opt.POOL_FLAGS))
@opt.sampling_options()
def generate(
    prompt: Annotated[str, typer.Option(
        "--prompt", "-p", metavar="TEXT", help="The prompt (- reads it from stdin; \\n and "
        "\\t are escapes).")],
    engine: dict | None = None,  # the engine options (ENGINE_FLAGS but POOL_FLAGS) stand here
    sampling: dict | None = None,  # the sampling options (SAMPLING_FLAGS) stand here
    chat: Annotated[bool, typer.Option(
        "--chat", help="Send the prompt as a user message through the chat template (the "
        "default model is a base model: it completes text).")] = False,
    system: opt.SystemOpt = None,
    chat_template: opt.ChatTemplateOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the text.")] = False,
    blas: opt.BlasOpt = "auto",
) -> None:
    """Print the completion of one prompt (stdout), then its token counts and speed
    (stderr)."""
    import dataclasses
    import logging

    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    config = opt.checked_engine_config(engine)
    try:
        params = opt.sampling_defaults(sampling or {})
        template = opt.read_chat_template(chat_template)
    except ValueError as e:
        raise typer.BadParameter(opt.flag_message(e)) from None
    text = sys.stdin.read() if prompt == "-" else opt.unescape(prompt)
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from mlxpa.engine.metrics import summarize
    from mlxpa.entrypoints.llm import LLM

    try:
        llm = LLM(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": text}]
            (out,) = llm.chat(messages, params, use_tqdm=False, chat_template=template)
        else:
            (out,) = llm.generate(f"{system}\n\n{text}" if system else text, params,
                                  use_tqdm=False)
    except (OSError, ValueError) as e:
        opt.fail(console, e, 1)
    if out.error is not None:
        opt.fail(console, ValueError(out.error), 1)
    for sample in out.outputs:
        print(sample.text, flush=True)
    if not quiet:
        stats = summarize(llm.llm_engine.counters)
        console.print(f"prompt {len(out.prompt_token_ids)} tokens, generated "
                      f"{stats.generation_tokens} tokens in {stats.elapsed_s:.2f} s "
                      f"({stats.output_tokens_per_s:.1f} tokens/s)", markup=False,
                      highlight=False)
