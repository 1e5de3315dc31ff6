"""Rows to requests, once for every entry point: the one merge of a row's sampling fields with
the run's defaults and the one tokenization (:func:`to_request`), and pass 2's stream of rows
in windows (:func:`feed`, :func:`windows`) that the local run, the Ray driver and the pool
sizing read."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from mlxpa.batch.prompts import prompt_token_ids
from mlxpa.batch.source import Source
from mlxpa.data import InputOptions, Row
from mlxpa.data.resume import id_key
from mlxpa.data.validate import Validation
from mlxpa.engine import PromptInput
from mlxpa.sampling_params import SamplingParams


def to_request(row: Row, defaults: SamplingParams, tokenizer, inputs: InputOptions,
               max_model_len: int | None = None) -> PromptInput | str:
    """The request of a valid row, or why it cannot run.

    Args:
        row: A row whose ``error`` is None.
        defaults: Sampling parameters for the fields the row does not set.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        inputs: The reader settings (``split_special_tokens``).
        max_model_len: The context in tokens: a prompt that leaves no room for an output
            token cannot run (None: not checked here; the engine checks it).

    Returns:
        ``PromptInput(row.index, prompt ids, merged parameters, row.id)``, or the message
        (without the row's place) when its fields conflict with the defaults, its
        ``messages`` cannot be rendered, or its prompt is over the context.
    """
    try:
        params = dataclasses.replace(defaults, **row.params)
        ids = prompt_token_ids(row, tokenizer, inputs.split_special_tokens)
    except ValueError as e:
        return str(e)
    return over_context(len(ids), max_model_len) or PromptInput(row.index, ids, params, row.id)


def over_context(num_tokens: int, max_model_len: int | None) -> str | None:
    """Why a prompt of ``num_tokens`` cannot run in a context of ``max_model_len`` tokens (it
    leaves no room for one output token; the engine's words), or None."""
    if max_model_len is None or num_tokens < max_model_len:
        return None
    return (f"prompt has {num_tokens} tokens; the limit is {max_model_len - 1} (the model "
            f"context (--max-model-len) holds {max_model_len} tokens)")


class Fed(NamedTuple):
    """One row of pass 2: its request, or the error row it gets, or neither (the output
    already holds it)."""

    row: Row
    request: PromptInput | None = None
    error: str | None = None


def feed(src: Source, validation: Validation, defaults: SamplingParams, tokenizer,
         max_model_len: int | None) -> Iterator[Fed]:
    """Pass 2: every row of ``src`` again, in input order, lazily, as a :class:`Fed`.

    Args:
        src: The input.
        validation: Pass 1's result (problems by row, ids already done).
        defaults: Sampling parameters for the fields a row does not set.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        max_model_len: The context (prompts over it get error rows); None: not checked.
    """
    for row in src.rows():
        if row.id is not None and id_key(row.id) in validation.done:
            yield Fed(row)
            continue
        error = row.error or validation.row_problems.get(row.index)
        if error is not None:
            yield Fed(row, error=error)
            continue
        req = to_request(row, defaults, tokenizer, src.inputs, max_model_len)
        yield Fed(row, error=f"{src.place(row)}: {req}") if isinstance(req, str) else Fed(
            row, req)


def windows(rows: Iterable[Fed], size: int) -> Iterator[list[Fed]]:
    """``rows`` in lists of ``size`` (the last may be shorter; none is empty)."""
    window: list[Fed] = []
    for fed in rows:
        window.append(fed)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window
