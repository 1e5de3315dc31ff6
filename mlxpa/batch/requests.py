"""Rows to requests for every file entry point: a row through the input processor
(:func:`to_request`: its fields merged with the run's defaults there), and pass 2's stream of
rows (:func:`rows_to_requests`) that the local run, the Ray driver, the pool sizing and
``mlxpa plan`` read. A row's request id is its id as text (its index when it has none):
unique within a run, since pass 1 refuses a repeated id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from mlxpa.batch.source import Source
from mlxpa.data import Row
from mlxpa.data.resume import id_key
from mlxpa.data.validate import Validation
from mlxpa.inputs import InputProcessor
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams


def to_request(row: Row, defaults: SamplingParams, processor: InputProcessor,
               permute: bool = False) -> EngineRequest | str:
    """The request of a valid row, or why it cannot run.

    Args:
        row: A row whose ``error`` is None.
        defaults: Sampling parameters for the fields the row does not set.
        processor: The model's input processor (its ``max_model_len``, when set, refuses a
            prompt over the context).
        permute: A row asked questions is also scored with its labels in a second order.

    Returns:
        :meth:`InputProcessor.process_inputs` of the row's request under ``str(row.id)`` (a
        row asked questions: its question group; sampling fields do not apply), or the
        message (without the row's place) when its fields conflict with the defaults, its
        ``messages`` cannot be rendered, or its prompt is over the context.
    """
    try:
        return processor.process_inputs(str(row.id), row.as_request(), defaults,
                                        permute=permute)
    except ValueError as e:
        return str(e)


class RowRequest(NamedTuple):
    """One row of pass 2: its request, or the error row it gets, or neither (the output
    already holds it)."""

    row: Row
    request: EngineRequest | None = None
    error: str | None = None


def rows_to_requests(src: Source, validation: Validation, defaults: SamplingParams,
                     processor: InputProcessor) -> Iterator[RowRequest]:
    """Pass 2: every row of ``src`` again, in input order, lazily, as a :class:`RowRequest`.

    Args:
        src: The input.
        validation: Pass 1's result (problems by row, ids already done).
        defaults: Sampling parameters for the fields a row does not set.
        processor: The model's input processor (prompts over its ``max_model_len`` get
            error rows).
    """
    for row in src.rows():
        if row.id is not None and id_key(row.id) in validation.done:
            yield RowRequest(row)
            continue
        error = row.error or validation.row_problems.get(row.index)
        if error is not None:
            yield RowRequest(row, error=error)
            continue
        req = to_request(row, defaults, processor, src.inputs.permute_labels)
        yield (RowRequest(row, error=f"{src.place(row)}: {req}") if isinstance(req, str)
               else RowRequest(row, req))
