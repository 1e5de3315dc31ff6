"""Requests to engine requests, once for every entry point (vLLM's input processor):
:meth:`InputProcessor.process_inputs` takes a parsed request (:mod:`mlxpa.inputs.schema`) or
a prompt, merges the request's fields with the caller's defaults (the one merge), checks token
ids against the vocabulary, tokenizes or renders the chat template, and checks the prompt
against the context. Every problem is a ``ValueError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlxpa.annotation.answers import scored_questions
from mlxpa.annotation.render import prompt_text, question_messages
from mlxpa.inputs.encode import chat_token_ids, text_token_ids
from mlxpa.inputs.prompts import (
    ChatPrompt,
    PromptType,
    parse_messages,
    template_kwargs_problem,
    text_problem,
    token_ids_problem,
)
from mlxpa.inputs.schema import ParsedRequest
from mlxpa.messages import token_id_problem
from mlxpa.request import EngineRequest, QuestionPrompt, common_prefix
from mlxpa.sampling_params import SamplingParams
from mlxpa.structured.spec import check

# Fields whose values are token ids (each id, of ``logit_bias`` each key, must index the
# model's vocabulary).
TOKEN_ID_FIELDS = ("stop_token_ids", "logit_bias")

# A question group's KV room per fork beyond its tokens: one partial block copied on its first
# write (the default block size; the pool's sizing only reads it as an upper bound).
FORK_ROOM = 16


class InputProcessor:
    """The requests of one model's prompts.

    Args:
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        vocab_size: Token ids must be below it (None: not checked here).
        max_model_len: The context in tokens: a prompt must leave room for one output token
            (None: not checked here; the engine checks it).
        split_special_tokens: Tokenize control-token text in a text prompt as ordinary text
            (chat messages always are; ``mlxpa run --split-special-tokens``).
        chat_template: A chat template to render messages with instead of the model's
            (``--chat-template``), or None.
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None = None,
                 max_model_len: int | None = None, *, split_special_tokens: bool = False,
                 chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.split_special_tokens = split_special_tokens
        self.chat_template = chat_template
        self._label_tokens: dict[tuple[str, ...], int] = {}

    def process_inputs(self, request_id: str, prompt: PromptType | ParsedRequest,
                       params: SamplingParams, *, permute: bool = False) -> EngineRequest:
        """The engine's request for ``prompt`` (the one entry point).

        Args:
            request_id: The caller's id (a server's request id, ``LLM``'s prompt index, a
                file row's id as text); the engine refuses one it is still running.
            prompt: A parsed request (a row, a body, a dict prompt; its problems are raised): its
                fields merged with ``params`` (:meth:`sampling_params`), or its questions'
                group (:meth:`question_request`; ``permute``: the label order check too); or
                a text prompt, a list of token ids, or a :class:`ChatPrompt`, sampled with
                ``params`` as they are.
            params: The sampling parameters (a parsed request's defaults).

        Raises:
            TypeError: ``request_id`` not a string, ``prompt`` or ``params`` of a wrong type.
            ValueError: Naming the field: :meth:`sampling_params`, :meth:`check_params`,
                :meth:`prompt_request`.
        """
        if not isinstance(prompt, ParsedRequest):
            self.check_params(params)
            return self.prompt_request(request_id, prompt, params)
        if prompt.problems:
            raise ValueError("; ".join(prompt.problems))
        merged = self.sampling_params(prompt, params)
        if prompt.questions is not None:  # scored: its sampling fields do not apply
            return self.question_request(request_id, *question_prompts(prompt, permute),
                                         cache_salt=prompt.cache_salt)
        return self.prompt_request(request_id, prompt.prompt_type(), merged,
                                   add_special_tokens=prompt.add_special_tokens,
                                   cache_salt=prompt.cache_salt)

    def sampling_params(self, request: ParsedRequest,
                        defaults: SamplingParams | None) -> SamplingParams | None:
        """A parsed request's sampling parameters: its fields merged with ``defaults``, the
        one merge (:meth:`~mlxpa.sampling_params.SamplingParams.merged`); first its token ids
        (and its prompt's) against the vocabulary. None when ``defaults`` is None (only the
        token ids are checked: a validation pass without a run's defaults).

        Raises:
            ValueError: Every token id problem (``field "logit_bias": token id ...``), or a
                rule between two fields once merged (``min_tokens must be <= ...``).
        """
        if self.vocab_size is not None:
            problems = token_id_problems(request.params, self.vocab_size, request.prefix)
            if request.prompt_token_ids is not None:
                problems += filter(None, [token_id_problem(
                    "prompt_token_ids", request.prompt_token_ids, self.vocab_size)])
            if problems:
                raise ValueError("; ".join(problems))
        return None if defaults is None else defaults.merged(request.params)

    def check_params(self, params: SamplingParams) -> None:
        """Check what ``params`` holds beyond its own ranges: its constraint compiles, its
        token ids (``stop_token_ids``, ``logit_bias``) index the vocabulary.

        Raises:
            TypeError: ``params`` is not a :class:`SamplingParams`.
            ValueError: ``structured_outputs: <why>``, or ``field "<name>": token id ...``.
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got "
                            f"{type(params).__name__}")
        so = params.structured_outputs
        problem = check(so) if so is not None else None
        if problem is not None:
            raise ValueError(f"structured_outputs: {problem}")
        if self.vocab_size is not None:
            for name, ids in (("stop_token_ids", params.stop_token_ids),
                              ("logit_bias", params.logit_bias or ())):
                problem = token_id_problem(name, ids, self.vocab_size)
                if problem is not None:
                    raise ValueError(problem)

    def prompt_request(self, request_id: str, prompt: PromptType, params: SamplingParams, *,
                       add_special_tokens: bool | None = None,
                       cache_salt: str | None = None) -> EngineRequest:
        """:meth:`process_inputs` for ``params`` already checked (a file row's fields are
        checked as they are read): the prompt tokenized and checked, the request built
        (under ``cache_salt``: its prefix-cache namespace, checked by the request schema).

        Raises:
            TypeError: ``request_id`` is not a string, ``prompt`` of a wrong type.
            ValueError: The prompt's field (:meth:`prompt_token_ids`), or a prompt that
                leaves no room for an output token in the context (:func:`over_context`).
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}")
        ids = self.prompt_token_ids(prompt, add_special_tokens)
        problem = over_context(len(ids), self.max_model_len)
        if problem is not None:
            raise ValueError(problem)
        return EngineRequest(request_id, ids, params, cache_salt=cache_salt)

    def question_request(self, request_id: str, prompts: list[PromptType],
                         labels: list[tuple[str, ...]], *,
                         cache_salt: str | None = None) -> EngineRequest:
        """A question group's request (:mod:`mlxpa.engine.question_scores`): each question's
        prompt (a text, or chat messages, ending where its labels are scored) tokenized as
        :meth:`prompt_token_ids` does, with its labels, under ``cache_salt``.

        The request's tokens are the document (the prompts' longest common token prefix);
        its ``max_tokens`` the most tokens the questions hold after it (their own tokens,
        their labels', a block per fork), which the KV pool's sizing reads.

        Raises:
            TypeError: ``request_id`` is not a string, a prompt of a wrong type.
            ValueError: A prompt's field, or a prompt over the context (``questions[i]: ...``).
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}")
        ids = [self.prompt_token_ids(p) for p in prompts]
        for i, x in enumerate(ids):
            problem = over_context(len(x), self.max_model_len)
            if problem is not None:
                raise ValueError(f"questions[{i}]: {problem}")
        shared = common_prefix(ids)
        room = sum(len(x) - shared + self._label_room(ls) for x, ls in zip(ids, labels))
        return EngineRequest(request_id, ids[0][:shared], SamplingParams(max_tokens=room),
                             tuple(QuestionPrompt(x, tuple(ls)) for x, ls in zip(ids, labels)),
                             cache_salt)

    def _label_room(self, labels: tuple[str, ...]) -> int:
        """KV tokens a question's labels can hold: each label forks with its tokens."""
        key = tuple(labels)
        longest = self._label_tokens.get(key)
        if longest is None:
            if len(self._label_tokens) >= 4096:
                self._label_tokens.clear()
            longest = self._label_tokens[key] = max(
                len(self.tokenizer.encode(c, add_special_tokens=False)) for c in labels)
        return len(labels) * (longest + FORK_ROOM) + FORK_ROOM

    def prompt_token_ids(self, prompt: PromptType,
                         add_special_tokens: bool | None = None) -> list[int]:
        """The token ids of ``prompt`` (BOS included when the tokenizer adds one, or as
        ``add_special_tokens`` says): token ids as given, a text tokenized, chat messages
        rendered by the chat template.

        Raises:
            TypeError: ``prompt`` is none of these.
            ValueError: Naming the field: an empty text (``prompt``), token ids that are not
                ints >= 0 or outside the vocabulary (``prompt_token_ids``), messages of a
                wrong shape (``messages[1].content``), template variables
                (``chat_template_kwargs``), a model without a chat template or a template
                that rejects the messages (``messages``).
        """
        if isinstance(prompt, str):
            _raise(text_problem(prompt))
            return text_token_ids(prompt, self.tokenizer, self.split_special_tokens,
                                  add_special_tokens)
        if isinstance(prompt, ChatPrompt):
            return self._chat_token_ids(prompt, add_special_tokens)
        if isinstance(prompt, (list, tuple)):
            _raise(token_ids_problem(prompt))
            if self.vocab_size is not None:
                _raise(token_id_problem("prompt_token_ids", prompt, self.vocab_size))
            return list(prompt)
        raise TypeError("prompt must be a string, a list of token ids or a ChatPrompt, got "
                        f"{type(prompt).__name__}")

    def _chat_token_ids(self, prompt: ChatPrompt, add_special_tokens: bool | None) -> list[int]:
        messages, problem = parse_messages(prompt.messages)
        _raise(problem)
        _raise(template_kwargs_problem(prompt.chat_template_kwargs))
        if not isinstance(prompt.add_generation_prompt, bool):
            raise TypeError("add_generation_prompt must be True or False, got "
                            f"{type(prompt.add_generation_prompt).__name__}")
        kwargs = {"add_generation_prompt": prompt.add_generation_prompt,
                  **(prompt.chat_template_kwargs or {})}
        return chat_token_ids(messages, self.tokenizer, kwargs, self.chat_template,
                              add_special_tokens)


def question_prompts(request: ParsedRequest, permute: bool = False
                     ) -> tuple[list[PromptType], list[tuple[str, ...]]]:
    """The prompt and labels of each question a request asked questions is scored with
    (:func:`mlxpa.annotation.answers.scored_questions`; ``permute``: the label order check's
    too): its text with the question's suffix, or its messages with the question's turn
    (:mod:`mlxpa.annotation.render`)."""
    qs, prompts = request.questions, []
    for q in scored_questions(qs, permute):
        if request.messages is not None:
            prompts.append(ChatPrompt(question_messages(request.messages, q, qs.preamble),
                                      request.chat_template_kwargs))
        else:
            prompts.append(prompt_text(request.prompt, q, qs.preamble))
    return prompts, [q.labels for q in scored_questions(qs, permute)]


def token_id_problems(params: Mapping[str, Any], vocab_size: int, prefix: str = "") -> list[str]:
    """One problem per field of ``params`` (:data:`TOKEN_ID_FIELDS`) with a token id outside
    the model's vocabulary, ``0 <= id < vocab_size`` (``prefix``: before field names)."""
    found = (token_id_problem(prefix + name, params.get(name) or (), vocab_size)
             for name in TOKEN_ID_FIELDS)
    return [p for p in found if p is not None]


def over_context(num_tokens: int, max_model_len: int | None) -> str | None:
    """Why a prompt of ``num_tokens`` cannot run in a context of ``max_model_len`` tokens (it
    leaves no room for one output token; the engine's words), or None."""
    if max_model_len is None or num_tokens < max_model_len:
        return None
    return (f"prompt has {num_tokens} tokens; the limit is {max_model_len - 1} (the model "
            f"context (--max-model-len) holds {max_model_len} tokens)")


def _raise(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)
