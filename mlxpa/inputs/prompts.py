"""What a prompt may be, and the one definition of each rule a prompt's fields keep: a text
prompt, vLLM's token-id prompt, chat messages with the template's variables. The file rows'
parser (:mod:`mlxpa.data.rows`) and the input processor both check with these, so a field is
refused in the same words wherever it comes from. No tokenizer here.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    content parts joined by newlines (as vLLM does).

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
