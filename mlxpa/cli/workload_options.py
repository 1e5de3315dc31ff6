"""The synthetic workloads' options (their shape: prompts, lengths, groups), one table for
``mlxpa bench`` and ``mlxpa bench serve``; each command sets its own defaults."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from mlxpa.cli.options import option_group


def _below_one(value: float) -> float:
    """``--range-ratio`` is below 1 (a prompt of length 0 otherwise)."""
    if value >= 1:
        raise typer.BadParameter(f"must be below 1, got {value}")
    return value


_NUM_PROMPTS = Annotated[int, typer.Option(
    min=1, help="random, annotation, the text workloads: prompts (file: every valid row).")]
_INPUT_LEN = Annotated[int, typer.Option(min=1, help="random: mean prompt tokens.")]
_RANGE_RATIO = Annotated[float, typer.Option(
    min=0, callback=_below_one, help="random: length spread.")]
_OUTPUT_LEN = Annotated[int, typer.Option(
    min=1, help="Tokens per prompt, max_tokens (file: rows without max_tokens; the text "
    "workloads: their own most, ending at a stop string or EOS).")]
_NUM_GROUPS = Annotated[int, typer.Option(min=1, help="shared-prefix: system prompts.")]
_PROMPTS_PER_GROUP = Annotated[int, typer.Option(
    min=1, help="shared-prefix: prompts per system prompt.")]
_SYSTEM_PROMPT_LEN = Annotated[int, typer.Option(
    min=1, help="shared-prefix: tokens of the shared system prompt.")]
_QUESTION_LEN = Annotated[int, typer.Option(min=1, help="shared-prefix: tokens of each question.")]

# The options in --help order, by parameter name (make_workload's keywords).
WORKLOAD_SHAPE = {"num_prompts": _NUM_PROMPTS, "input_len": _INPUT_LEN,
                  "range_ratio": _RANGE_RATIO, "output_len": _OUTPUT_LEN,
                  "num_groups": _NUM_GROUPS, "prompts_per_group": _PROMPTS_PER_GROUP,
                  "system_prompt_len": _SYSTEM_PROMPT_LEN, "question_len": _QUESTION_LEN}


def workload_options(**defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add every option of :data:`WORKLOAD_SHAPE` to a Typer command, with ``defaults`` (one
    per option). The command takes them as one parameter, ``shape``: ``{name: value}``, the
    keywords of the workload makers; the options stand where ``shape`` stands in its
    signature.

    Raises:
        ValueError: ``defaults`` does not name every option exactly.
    """
    if set(defaults) != set(WORKLOAD_SHAPE):
        raise ValueError(f"defaults for exactly {', '.join(WORKLOAD_SHAPE)}")
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name],
                               annotation=opt) for name, opt in WORKLOAD_SHAPE.items()]

    return option_group("shape", added)
