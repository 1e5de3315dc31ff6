"""A row ready for a replica: the validated :class:`~mlxpa.data.Row`, its prompt token ids
and its merged sampling parameters (what the local run's ``_Job._feed`` makes of a row)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from mlxpa.batch.prompts import prompt_token_ids
from mlxpa.config import SamplingParams
from mlxpa.data import Row


class Item(NamedTuple):
    """One row to run on a replica.

    Attributes:
        index: ``Row.index`` (the engine's request id and the output position).
        row: The validated row (its id, ``keep`` columns and OpenAI kind shape the output).
        prompt_token_ids: Prompt token ids (BOS included when the tokenizer adds one).
        params: The run's defaults with the row's own sampling fields.
    """

    index: int
    row: Row
    prompt_token_ids: list[int]
    params: SamplingParams


def make_item(row: Row, defaults: SamplingParams, tokenizer, place: str) -> Item | str:
    """The :class:`Item` of a valid row, or the error message of a row that cannot run.

    Args:
        row: A row whose ``error`` is None.
        defaults: Sampling parameters for fields the row does not set.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        place: Where the row came from (``file line 3``), put before the message.

    Returns:
        The item, or ``"<place>: <why>"`` when its sampling fields conflict with the defaults
        or its ``messages`` cannot be rendered (no chat template, rejected by it).
    """
    try:
        params = dataclasses.replace(defaults, **row.params)
        ids = prompt_token_ids(row, tokenizer)
    except ValueError as e:
        return f"{place}: {e}"
    return Item(row.index, row, ids, params)
