"""Pass 1's checks of a row's prompt that need the tokenizer but not the weights
(:func:`prompt_checker`: its chat messages against the template, a choice row's labels after
its prompt, each question's labels after its prompt), with the input processor's own rules
(:mod:`mlxpa.inputs`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from mlxpa.annotation.answers import scored_questions
from mlxpa.data import Row
from mlxpa.inputs import InputProcessor, PromptType
from mlxpa.inputs.encode import chat_token_ids, render_chat
from mlxpa.inputs.processor import question_prompts
from mlxpa.sampling_params import StructuredOutput
from mlxpa.structured.labels import LabelJoiner, choice_label_checker


def row_prompt(row: Row) -> PromptType:
    """The prompt of a valid row (``row.error`` None) as the input processor takes it: its
    ``prompt_token_ids``, its ``messages`` with its ``chat_template_kwargs``, or its text."""
    return row.as_request().prompt_type()


def question_checker(get_tokenizer: Callable[[], object | None], split_special_tokens: bool,
                     permute: bool, chat_template: str | None = None
                     ) -> Callable[[Row], str | None]:
    """A validation-pass check of rows asked questions: ``check(row)`` says why a question's
    labels cannot be scored after its prompt (naming ``questions[i].labels``), else None.
    ``get_tokenizer`` is called at the first such row; None from it turns the check off."""
    held: list = []

    def check(row: Row) -> str | None:
        if row.questions is None:
            return None
        if not held:
            tokenizer = get_tokenizer()
            held.append(None if tokenizer is None else (
                InputProcessor(tokenizer, split_special_tokens=split_special_tokens,
                               chat_template=chat_template), LabelJoiner(tokenizer)))
        if held[0] is None:
            return None
        processor, joiner = held[0]
        prompts, labels = question_prompts(row.as_request(), permute)
        n = len(row.questions.questions)
        for i, (prompt, ls) in enumerate(zip(prompts, labels)):
            try:
                joiner.join(processor.prompt_token_ids(prompt), ls)
            except ValueError as e:
                q = scored_questions(row.questions, permute)[i]
                second = " (listed in the second order)" if i >= n else ""
                return f'field "questions[{row.questions.names.index(q.name)}].labels"{second}: {e}'
            except TypeError:
                return None  # the prompt's own check reports it
        return None

    return check


def messages_checker(get_tokenizer: Callable[[], object | None],
                     chat_template: str | None = None) -> Callable[[Row], str | None]:
    """A validation-pass check of chat rows without the weights: ``check(row)`` is the error
    the input processor would raise for ``row``'s ``messages`` (no chat template, or the
    template rejects them; ``chat_template``: ``--chat-template``), else None.
    ``get_tokenizer`` is called once, at the first chat row (text-only inputs never load the
    tokenizer); None from it turns the check off."""
    held: list = []

    def check(row: Row) -> str | None:
        if row.messages is None:
            return None
        if not held:
            held.append(get_tokenizer())
        tokenizer = held[0]
        if tokenizer is None:
            return None
        try:
            if chat_template is None and not tokenizer.has_chat_template:
                chat_token_ids(row.messages, tokenizer)  # the error it raises
            render_chat(row.messages, tokenizer, row.chat_template_kwargs, chat_template)
        except ValueError as e:
            return str(e)
        return None

    return check


def prompt_checker(get_tokenizer: Callable[[], object | None], split_special_tokens: bool,
                   default: StructuredOutput | None, permute: bool = False,
                   chat_template: str | None = None) -> Callable[[Row], str | None]:
    """The validation pass's tokenizer checks of a row, without the weights: its ``messages``
    (:func:`messages_checker`), then a ``choice`` row's labels after its prompt
    (:func:`mlxpa.structured.labels.choice_label_checker`: labels that are the same tokens
    there are refused), a row's questions (:func:`question_checker`). ``get_tokenizer`` is
    called once, when the first row needs it.

    Args:
        get_tokenizer: The model's tokenizer (None turns the checks off: the load reports why).
        split_special_tokens: As the run tokenizes prompts.
        default: The run's default constraint (``--choice``), for rows that give none.
        permute: Questions are also scored with their labels in a second order.
        chat_template: ``--chat-template``: chat rows are rendered with it.
    """
    tokenizer = functools.cache(get_tokenizer)
    chat = messages_checker(tokenizer, chat_template)
    labels = choice_label_checker(
        tokenizer, lambda row, tok: InputProcessor(
            tok, split_special_tokens=split_special_tokens, chat_template=chat_template
        ).prompt_token_ids(row_prompt(row), row.add_special_tokens), default)
    questions = question_checker(tokenizer, split_special_tokens, permute, chat_template)
    return lambda row: chat(row) or (questions(row) if row.questions is not None
                                     else labels(row))
