"""The arguments of :class:`~mlxpa.entrypoints.llm.LLM`'s calls to engine requests, through
the one input processor (:class:`~mlxpa.inputs.InputProcessor`)::

    "text", [1, 2, 3]            -> the processor (tokenized, checked)
    chat conversation            -> ChatPrompt -> the processor (the chat template)
    {"prompt" | "messages" | "prompt_token_ids", "id", fields...}
                                 -> the request schema (a row of mlxpa run) -> the processor

Each prompt's request id is its ``id`` field (a dict), else its index in the call; ids are
unique per call, as in ``mlxpa run``. Every problem names the argument and the prompt's index
(``prompts[3]: field "temperature" must be ...``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from mlxpa.inputs import ChatPrompt, InputProcessor
from mlxpa.inputs.prompts import is_token_ids
from mlxpa.inputs.schema import ROW, RequestSpec, parse_request
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams


class PromptRequest(NamedTuple):
    """One prompt of a call with its request, or with why it cannot run.

    Attributes:
        index: The prompt's position in the call.
        request_id: Its id: a dict row's ``id`` as text, else ``str(index)``.
        request: The engine's request; None when it cannot run.
        prompt: The text prompt (None for token ids and chat messages).
        chat: The prompt is chat messages (its text is the rendered template, decoded).
        error: Why it cannot run, naming ``arg[index]``; None when it runs.
        questions: A dict row's question set (``QuestionSet``), when it is asked questions.
    """

    index: int
    request_id: str
    request: EngineRequest | None
    prompt: str | None = None
    chat: bool = False
    error: str | None = None
    questions: Any = None


def prompt_list(prompts: Any) -> list[Any]:
    """``prompts`` of :meth:`LLM.generate` as a list: one string, token-id list or dict is
    one prompt; any other iterable holds one prompt per item.

    Raises:
        TypeError: ``prompts`` is none of these.
    """
    if isinstance(prompts, (str, dict)) or (is_token_ids(prompts) and prompts):
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


def check_chat_options(chat_template_kwargs: Any, add_generation_prompt: Any) -> None:
    """Raises ``TypeError`` naming the argument when a chat option has the wrong type."""
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise TypeError("chat_template_kwargs must be a dict of template variables or None, "
                        f"got {type(chat_template_kwargs).__name__}")
    if not isinstance(add_generation_prompt, bool):
        raise TypeError("add_generation_prompt must be True or False, got "
                        f"{type(add_generation_prompt).__name__}")


def params_list(sampling_params: Any, num_prompts: int,
                processor: InputProcessor) -> list[SamplingParams]:
    """One :class:`SamplingParams` per prompt: ``sampling_params`` for every prompt, or its
    items in order (None: the defaults), each checked once here
    (:meth:`InputProcessor.check_params`).

    Raises:
        TypeError: Not a ``SamplingParams``, a list of them or None (naming the item).
        ValueError: A list of another length than the prompts', a constraint that does
            not compile, or a token id outside the vocabulary (naming the item).
    """
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        check_params(sampling_params or SamplingParams(), "sampling_params", processor)
        return [sampling_params or SamplingParams()] * num_prompts
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError("sampling_params must be a SamplingParams, a list of them (one per "
                        f"prompt) or None, got {type(sampling_params).__name__}")
    if len(sampling_params) != num_prompts:
        raise ValueError(f"sampling_params: {len(sampling_params)} given for {num_prompts} "
                         "prompts (give one, or one per prompt)")
    for i, params in enumerate(sampling_params):
        check_params(params, f"sampling_params[{i}]", processor)
    return list(sampling_params)


def check_params(params: Any, name: str, processor: InputProcessor) -> None:
    """:meth:`InputProcessor.check_params`, its errors naming ``name``.

    Raises:
        TypeError: ``params`` is not a :class:`SamplingParams`.
        ValueError: Its constraint does not compile, or one of its token ids is outside the
            vocabulary.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"{name} must be a SamplingParams, got {type(params).__name__}")
    try:
        processor.check_params(params)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def prompt_request(index: int, prompt: str | list[int] | ChatPrompt, params: SamplingParams,
                   processor: InputProcessor, arg: str) -> PromptRequest:
    """The request of a text, token-id or chat prompt (``params`` checked already), or why it
    cannot run (naming ``arg[index]``).

    Raises:
        TypeError: ``prompt`` is none of these (naming ``arg[index]``).
    """
    place = f"{arg}[{index}]"
    if not (isinstance(prompt, (str, ChatPrompt)) or is_token_ids(prompt)):
        raise TypeError(f"{place}: expected a string, a list of token ids or a dict (a row of "
                        f"mlxpa run), got {type(prompt).__name__}")
    text = prompt if isinstance(prompt, str) else None
    chat = isinstance(prompt, ChatPrompt)
    try:
        request = processor.prompt_request(str(index), prompt, params)
    except ValueError as e:
        return PromptRequest(index, str(index), None, text, chat, f"{place}: {e}")
    return PromptRequest(index, str(index), request, text, chat)


def dict_request(index: int, obj: dict[str, Any], params: SamplingParams,
                 processor: InputProcessor, arg: str = "prompts", spec: RequestSpec = ROW,
                 permute: bool = False) -> PromptRequest:
    """The request of a dict prompt (a row of ``mlxpa run``: read by the request schema, its
    fields merged with ``params`` by the input processor), or why it cannot run (naming
    ``arg[index]``). Its request id is its ``id`` field as text (its index when it has none).
    ``spec``: how it is read (a question set asked of every dict); ``permute``: the label
    order check."""
    place = f"{arg}[{index}]"
    parsed = parse_request(obj, spec, index=index)
    problem, request = "; ".join(parsed.problems) or None, None
    if problem is None:
        try:
            request = processor.process_inputs(str(parsed.id), parsed, params, permute=permute)
        except ValueError as e:
            problem = str(e)
    return PromptRequest(index, str(index if parsed.id is None else parsed.id), request,
                         parsed.prompt, parsed.messages is not None,
                         None if problem is None else f"{place}: {problem}", parsed.questions)


class CallIds:
    """The request ids of one call's prompts, unique as ``mlxpa run`` keeps a file's: a
    prompt's id is its ``id`` field (as text: ``7`` and ``"7"`` are one id), else its index;
    the first prompt with an id keeps it, a later one is refused. Holds only the ids given in
    ``id`` fields, so a stream of plain prompts takes no memory here.
    """

    def __init__(self, arg: str) -> None:
        self.arg = arg
        self._given: dict[str, int] = {}  # an id from an "id" field -> the prompt's index
        self._own = set()  # indices of the prompts with an "id" field

    def claim(self, index: int, request_id: str, given: bool) -> str | None:
        """Claim ``request_id`` for prompt ``index`` (``given``: from its ``id`` field, not
        its index); returns None, or why it is refused (``prompts[3]: duplicate id "a" (first at
        prompts[1]) ...``)."""
        first = self._given.get(request_id)
        if first is None and given and _index_id(request_id, index, self._own):
            first = int(request_id)
        if first is None:
            if given:
                self._given[request_id] = index
                self._own.add(index)
            return None
        return (f"{self.arg}[{index}]: duplicate id {json.dumps(request_id)} (first at "
                f"{self.arg}[{first}]; a prompt's id is its \"id\" field, else its index)")


def _index_id(request_id: str, index: int, own: set[int]) -> bool:
    """Whether ``request_id`` is the id of an earlier prompt without an ``id`` field (its
    index, as text)."""
    if not (request_id.isdecimal() and request_id == str(int(request_id))):
        return False
    return int(request_id) < index and int(request_id) not in own
