"""The arguments of :class:`~mlxpa.entrypoints.llm.LLM`'s calls to the rows ``mlxpa run``
reads, so both take the one path from rows to requests (``parse_row``, then
:func:`~mlxpa.batch.requests.to_request`: the one merge of a row's fields with the sampling
parameters, the one tokenization)::

    "text"                       -> {"prompt": "text"}
    [1, 2, 3], TokensPrompt      -> {"prompt_token_ids": [1, 2, 3]}
    {"prompt" | "messages" | "prompt_token_ids", "id", fields...}   (a JSONL row, as it is)
    chat conversation            -> {"messages": [...], "add_generation_prompt", ...}

Every problem names the argument and the prompt's index (``prompts[3]: field "temperature"
must be ...``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mlxpa.batch.requests import Fed, to_request
from mlxpa.data import InputOptions, Row
from mlxpa.data.inputs import RowSpec
from mlxpa.data.rows import parse_row
from mlxpa.data.validate import run_problem
from mlxpa.messages import token_id_problem
from mlxpa.sampling_params import SamplingParams
from mlxpa.structured.spec import check

INPUTS = InputOptions()


def prompt_list(prompts: Any) -> list[Any]:
    """``prompts`` of :meth:`LLM.generate` as a list: one string, token-id list or dict is
    one prompt; any other iterable holds one prompt per item.

    Raises:
        TypeError: ``prompts`` is none of these.
    """
    if isinstance(prompts, (str, dict)) or _token_ids(prompts):
        return [prompts]
    if isinstance(prompts, Iterable):
        return list(prompts)
    raise TypeError("prompts must be a string, a list of token ids, a dict (a row of mlxpa "
                    f"run) or a list of them, got {type(prompts).__name__}")


def conversation_list(messages: Any) -> list[Any]:
    """``messages`` of :meth:`LLM.chat` as a list of conversations: a list of message dicts
    is one conversation, a list of such lists is several.

    Raises:
        TypeError: ``messages`` is neither.
    """
    if isinstance(messages, (list, tuple)) and messages:
        if all(isinstance(m, dict) for m in messages):
            return [list(messages)]
        if all(isinstance(c, (list, tuple)) for c in messages):
            return list(messages)
    raise TypeError('messages must be a conversation (a non-empty list of {"role", '
                    '"content"} dicts) or a list of conversations')


def chat_row(conversation: Any, chat_template_kwargs: dict[str, Any] | None,
             add_generation_prompt: bool) -> dict[str, Any]:
    """The ``messages`` row of one conversation (vLLM's chat fields as row fields)."""
    return {"messages": conversation, "add_generation_prompt": add_generation_prompt,
            "chat_template_kwargs": chat_template_kwargs}


def check_chat_options(chat_template_kwargs: Any, add_generation_prompt: Any) -> None:
    """Raises ``TypeError`` naming the argument when a chat option has the wrong type."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise TypeError("chat_template_kwargs must be a dict of template variables or None, "
                        f"got {type(chat_template_kwargs).__name__}")
    if not isinstance(add_generation_prompt, bool):
        raise TypeError("add_generation_prompt must be True or False, got "
                        f"{type(add_generation_prompt).__name__}")


def params_list(sampling_params: Any, num_prompts: int,
                vocab_size: int | None = None) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt: ``sampling_params`` for every prompt, or its
    items in order (None: the defaults). Each constraint is compiled once here.

    Raises:
        TypeError: Not a ``SamplingParams``, a list of them or None (naming the item).
        ValueError: A list of another length than the prompts', a constraint that does
            not compile, or a token id outside ``vocab_size`` (naming the item).
    """
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        check_params(sampling_params or SamplingParams(), "sampling_params", vocab_size)
        return [sampling_params or SamplingParams()] * num_prompts
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError("sampling_params must be a SamplingParams, a list of them (one per "
                        f"prompt) or None, got {type(sampling_params).__name__}")
    if len(sampling_params) != num_prompts:
        raise ValueError(f"sampling_params: {len(sampling_params)} given for {num_prompts} "
                         "prompts (give one, or one per prompt)")
    for i, params in enumerate(sampling_params):
        check_params(params, f"sampling_params[{i}]", vocab_size)
    return list(sampling_params)


def check_params(params: Any, name: str, vocab_size: int | None = None) -> None:
    """Raises ``TypeError`` when ``params`` is not a :class:`SamplingParams`, ``ValueError``
    when its constraint does not compile or one of its token ids (``stop_token_ids``,
    ``logit_bias``) is not below ``vocab_size`` (both naming ``name``)."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"{name} must be a SamplingParams, got {type(params).__name__}")
    so = params.structured_outputs
    problem = check(so) if so is not None else None
    if problem is not None:
        raise ValueError(f"{name}: structured_outputs: {problem}")
    if vocab_size is not None:
        for field, ids in (("stop_token_ids", params.stop_token_ids),
                           ("logit_bias", params.logit_bias or ())):
            problem = token_id_problem(field, ids, vocab_size)
            if problem is not None:
                raise ValueError(f"{name}: {problem}")


def prompt_fed(index: int, prompt: Any, params: SamplingParams, tokenizer, *,
               vocab_size: int | None, max_model_len: int | None, arg: str = "prompts") -> Fed:
    """The row of one prompt with its request, or with why it cannot run (``fed.error``,
    naming ``arg[index]``): its fields (as a file row's are checked), its token ids against
    the vocabulary, its fields merged with ``params``, its chat template, the context.

    Args:
        index: The prompt's position in the call (its row index and default id).
        prompt: A string, a list of token ids, or a dict row.
        params: The sampling parameters the row's own fields override.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        vocab_size: The model's vocabulary size (token ids are checked against it).
        max_model_len: The context in tokens.
        arg: The argument's name in messages (``prompts``, ``messages``).

    Raises:
        TypeError: ``prompt`` is not a string, a list of token ids or a dict.
    """
    place = f"{arg}[{index}]"
    row = parse_row(_as_row(prompt, place), index, None, RowSpec(place, "row", INPUTS))
    problem = row.error or run_problem(row, params, vocab_size)
    if problem is None:
        req = to_request(row, params, tokenizer, INPUTS, max_model_len)
        if not isinstance(req, str):
            return Fed(row, req)
        problem = req
    return Fed(row, error=problem if problem.startswith(place) else f"{place}: {problem}")


def failed_fed(index: int, error: str) -> Fed:
    """The row of a prompt that is not one (a streamed item of a wrong type)."""
    return Fed(Row(index, index, None, None, {}, error), error=error)


def _as_row(prompt: Any, place: str) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, dict):
        return prompt
    if isinstance(prompt, (list, tuple)) and _token_ids(prompt, empty=True):
        return {"prompt_token_ids": list(prompt)}
    raise TypeError(f"{place}: expected a string, a list of token ids or a dict (a row of "
                    f"mlxpa run), got {type(prompt).__name__}")


def _token_ids(value: Any, empty: bool = False) -> bool:
    return isinstance(value, (list, tuple)) and (empty or bool(value)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)
