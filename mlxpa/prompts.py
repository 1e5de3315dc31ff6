"""Rows to prompt token ids: text prompts tokenized, chat messages rendered by the model's
chat template (mlx-lm's rule for BOS: a rendered template that already starts with the BOS
text is encoded without adding special tokens, so exactly one BOS is present)."""

from __future__ import annotations

from mlxpa.data import Row


def prompt_token_ids(row: Row, tokenizer) -> list[int]:
    """Token ids of ``row``'s prompt.

    Args:
        row: A valid row (``row.error`` is None).
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.

    Returns:
        Prompt token ids (BOS included when the tokenizer adds one).

    Raises:
        ValueError: ``messages`` given but the model has no chat template, or the template
            rejects them (e.g. roles that do not alternate).
    """
    if row.messages is not None:
        if not tokenizer.has_chat_template:
            raise ValueError(
                "field \"messages\": this model has no chat template; give a text \"prompt\"")
        try:
            text = tokenizer.apply_chat_template(row.messages, tokenize=False,
                                                 add_generation_prompt=True)
        except Exception as e:  # jinja2 TemplateError and friends: the row's fault
            raise ValueError(f"field \"messages\": the chat template rejected them: {e}") from e
    else:
        text = row.prompt
    bos = tokenizer.bos_token
    add_special = not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special_tokens=add_special)
