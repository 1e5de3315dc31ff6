"""A dict prompt of :meth:`LLM.generate`: mlxpa's extension, a row of ``mlxpa run`` with its
own ``id`` and fields, read as a file row is (:func:`mlxpa.data.rows.parse_row`, its fields
merged with the call's parameters, its prompt through the input processor:
:func:`mlxpa.batch.requests.to_request`), so it gets what the same line of a file gets.
``LLM`` imports this module only for a dict prompt; text, token-id and chat prompts never
touch the file pipeline.
"""

from __future__ import annotations

from typing import Any

from mlxpa.batch.requests import to_request
from mlxpa.data import InputOptions
from mlxpa.data.inputs import RowSpec
from mlxpa.data.rows import parse_row
from mlxpa.data.validate import run_problem
from mlxpa.entrypoints.prompts import PromptRequest
from mlxpa.inputs import InputProcessor
from mlxpa.sampling_params import SamplingParams

INPUTS = InputOptions()


def row_request(index: int, obj: dict[str, Any], params: SamplingParams,
                processor: InputProcessor, arg: str = "prompts",
                inputs: InputOptions = INPUTS) -> PromptRequest:
    """The request of one dict row, or why it cannot run (naming ``arg[index]``): its fields
    (as a file row's are checked), its token ids against the vocabulary, its fields merged
    with ``params``, its chat template, the context. Its request id is its ``id`` field as
    text (its index when it has none). ``inputs``: the reader settings (a question set asked
    of every row, the label order check).
    """
    place = f"{arg}[{index}]"
    row = parse_row(obj, index, None, RowSpec(place, "row", inputs))
    problem = row.error or run_problem(row, params, processor.vocab_size)
    request = None
    if problem is None:
        request = to_request(row, params, processor, inputs.permute_labels)
        if isinstance(request, str):
            problem, request = request, None
    if problem is not None and not problem.startswith(place):
        problem = f"{place}: {problem}"
    return PromptRequest(index, str(index if row.id is None else row.id), request,
                         row.prompt, row.messages is not None, problem, row.questions)
