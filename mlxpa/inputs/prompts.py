"""What a prompt may be (a text, vLLM's token ids, chat messages with the template's
variables), and each rule its fields keep, stated once for the request schema and the input
processor, so a field is refused in the same words wherever it comes from. No tokenizer.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from mlxpa.messages import field_error_text, surrogate_problem


class ChatPrompt(NamedTuple):
    """Chat messages, rendered by the model's chat template (vLLM's chat request fields).

    Attributes:
        messages: ``[{"role": str, "content": str | [{"type": "text", "text": str}], ...}]``.
        chat_template_kwargs: More variables for the template (``enable_thinking``, ...); they
            win over ``add_generation_prompt``, as in vLLM.
        add_generation_prompt: End the prompt with the template's assistant turn opener.
    """

    messages: list[dict]
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


# A text prompt, a prompt's token ids (vLLM's TokensPrompt), or chat messages.
PromptType = str | Sequence[int] | ChatPrompt

TOKENS = "prompt_token_ids"  # vLLM's TokensPrompt field
# Arguments of ``apply_chat_template`` that change what it returns, not the template's text.
NOT_TEMPLATE_KWARGS = frozenset(("conversation", "tokenize", "return_dict", "return_tensors",
                                 "padding", "truncation", "max_length", "tokenizer_kwargs",
                                 "return_assistant_tokens_mask", "chat_template"))


def text_problem(value: Any, field: str = "prompt") -> str | None:
    """Why ``value`` is not a text prompt (Unicode text with something besides white space)."""
    if isinstance(value, str) and value.strip():
        return surrogate_problem(value, field)
    return field_error_text(field, "a non-empty string", value)


def is_token_ids(value: Any) -> bool:
    """Whether ``value`` is a list or tuple of ints (bools are not token ids)."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def token_ids_problem(value: Any, field: str = "prompt_token_ids") -> str | None:
    """Why ``value`` is not a prompt's token ids (a non-empty list of ints >= 0; the model's
    vocabulary is checked later, :func:`mlxpa.config.token_id_problem`)."""
    if is_token_ids(value) and value and all(t >= 0 for t in value):
        return None
    return field_error_text(field, "a non-empty list of token ids (integers >= 0)", value)


def parse_messages(value: Any, field: str = "messages") -> tuple[list[dict] | None, str | None]:
    """Chat messages checked and cleaned: keys with a null value dropped, OpenAI's text
    content parts joined by newlines and its ``developer`` role read as ``system`` (as vLLM
    and llama.cpp do: OpenAI's name for the system message since its o1 models).

    Returns:
        ``(messages, None)``, or ``(None, why)`` naming the field (``messages[2].content``).
    """
    if not isinstance(value, list) or not value:
        return None, field_error_text(field, 'a non-empty list of {"role", "content"} objects',
                                      value)
    problem = surrogate_problem(value, field)
    if problem is not None:
        return None, problem
    clean = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return None, field_error_text(f"{field}[{i}]", 'an object with "role" and "content"', m)
        m = {k: v for k, v in m.items() if v is not None}
        if isinstance(m.get("content"), list):
            text = _text_parts(m["content"])
            if text is None:
                return None, field_error_text(
                    f"{field}[{i}].content",
                    'a string or a list of {"type": "text", "text": string} parts', m["content"])
            m["content"] = text
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                return None, field_error_text(f"{field}[{i}].{key}", "a string", m.get(key))
        if m["role"] == "developer":
            m["role"] = "system"
        clean.append(m)
    return clean, None


def template_kwargs_problem(value: Any, field: str = "chat_template_kwargs") -> str | None:
    """Why ``value`` is not a dict of chat template variables (None is none)."""
    if value is None or (isinstance(value, dict) and all(
            isinstance(k, str) and k not in NOT_TEMPLATE_KWARGS for k in value)):
        return None
    return field_error_text(field, "an object of template variables (not "
               f"{', '.join(sorted(NOT_TEMPLATE_KWARGS))})", value)


def _text_parts(parts: list) -> str | None:
    """OpenAI content parts, text only, joined by newlines, or None."""
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    if not texts or len(texts) != len(parts) or not all(isinstance(t, str) for t in texts):
        return None
    return "\n".join(texts)


def read_prompt(fields: Mapping[str, Any], prompt_field: str, messages_field: str, prefix: str,
                problems: list[str]) -> tuple[str | None, list[dict] | None]:
    """A request's text prompt or its chat messages (checked and cleaned), from the fields
    ``prompt_field`` and ``messages_field``; each problem appended (``prefix``: before field
    names)."""
    pc, mc = prefix + prompt_field, prefix + messages_field
    prompt, messages = fields.get(prompt_field), fields.get(messages_field)
    if prompt is not None and messages is not None:
        problems.append(f'give field "{pc}" or field "{mc}", not both')
        return None, None
    if prompt is None and messages is None:
        if prompt_field in fields or messages_field in fields:
            null = pc if prompt_field in fields else mc
            problems.append(f'field "{null}" is null (and no "{mc if null == pc else pc}")')
        else:
            close = difflib.get_close_matches(pc, list(fields), 1, 0.7) or \
                difflib.get_close_matches(mc, list(fields), 1, 0.7)
            hint = f' (is "{close[0]}" a typo?)' if close else ""
            problems.append(f'missing field "{pc}" (or "{mc}"){hint}')
        return None, None
    if messages is None:
        problem = text_problem(prompt, pc)
        if problem is None:
            return prompt, None
        problems.append(problem)
        return None, None
    clean, problem = parse_messages(messages, mc)
    if problem is not None:
        problems.append(problem)
    return None, clean


def read_token_ids(fields: Mapping[str, Any], prompt_field: str, messages_field: str,
                   problems: list[str]) -> list[int] | None:
    """A row's ``prompt_token_ids`` (vLLM's TokensPrompt), given instead of a prompt."""
    ids = fields[TOKENS]
    given = [c for c in (prompt_field, messages_field) if fields.get(c) is not None]
    problem = (f'give field "{given[0]}" or field "{TOKENS}", not both' if given
               else token_ids_problem(ids, TOKENS))
    if problem is None:
        return list(ids)
    problems.append(problem)
    return None


def with_system(system: str, prompt: str | None,
                messages: list[dict] | None) -> tuple[str | None, list[dict] | None]:
    """``system`` put first: a system message before ``messages`` (unless they start with
    one), or text and a blank line before ``prompt``."""
    if messages is not None:
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system}, *messages]
        return None, messages
    if prompt is not None:
        return f"{system}\n\n{prompt}", None
    return None, None


def read_template_kwargs(fields: Mapping[str, Any], prefix: str, chat: bool,
                         problems: list[str]) -> dict[str, Any] | None:
    """``chat_template_kwargs`` with ``add_generation_prompt`` (the kwargs win, as in vLLM),
    or None when neither is set; both need ``messages``."""
    kwargs, gen = fields.get("chat_template_kwargs"), fields.get("add_generation_prompt")
    if kwargs is None and gen is None:
        return None
    found = [f for f, v in (("chat_template_kwargs", kwargs), ("add_generation_prompt", gen))
             if v is not None]
    if not chat:
        problems.append(f'field "{prefix}{found[0]}" needs field "{prefix}messages"')
        return None
    if gen is not None and not isinstance(gen, bool):
        problems.append(field_error_text(prefix + "add_generation_prompt", "true or false", gen))
        return None
    problem = template_kwargs_problem(kwargs, prefix + "chat_template_kwargs")
    if problem is not None:
        problems.append(problem)
        return None
    return {**({} if gen is None else {"add_generation_prompt": gen}), **(kwargs or {})}
