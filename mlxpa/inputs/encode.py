"""Prompts to token ids: text prompts tokenized, chat messages rendered by the model's chat
template (mlx-lm's rule for BOS: a rendered template that already starts with the BOS text is
encoded without adding special tokens, so exactly one BOS is present).

Control tokens (the tokenizer's special tokens: ``<start_of_turn>``, ``<end_of_turn>``,
``<eos>``, ``<bos>``, ``<|im_start|>`` ...) come only from the chat template: text in a
message that spells one is tokenized as ordinary text (Hugging Face's
``split_special_tokens``), exactly as the same text is when it spells none: each span between
the template's own control tokens is encoded once, so a message can neither forge a turn or end
its own prompt nor lose the merges across the edges of what it wrote. A text prompt is
tokenized as written, control tokens included (users pre-render templates there), unless
``split_special_tokens`` is set."""

from __future__ import annotations

import re
from collections.abc import Callable


def text_token_ids(text: str, tokenizer, split_special_tokens: bool = False,
                   add_special_tokens: bool | None = None) -> list[int]:
    """Token ids of a text prompt (BOS added by the tokenizer unless the text starts with it).

    Args:
        text: The prompt.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        split_special_tokens: Tokenize control-token text as ordinary text too (BOS is still
            added by the tokenizer).
        add_special_tokens: vLLM's request field: True or False overrides the BOS rule.
    """
    add = _adds_bos(tokenizer, text) if add_special_tokens is None else add_special_tokens
    if split_special_tokens:
        return _encode(tokenizer, text, add_special_tokens is not False, split=True)
    return _encode(tokenizer, text, add)


def control_tokens(tokenizer) -> list[str]:
    """The tokenizer's special (control) token strings, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    names = {t.content for t in decoder.values() if getattr(t, "special", False)}
    names.update(getattr(tokenizer, "all_special_tokens", None) or ())
    return sorted((n for n in names if n), key=len, reverse=True)


def chat_token_ids(messages: list[dict], tokenizer, template_kwargs: dict | None = None,
                   chat_template: str | None = None,
                   add_special_tokens: bool | None = None) -> list[int]:
    """Token ids of chat ``messages`` rendered by the model's chat template, or
    ``chat_template`` (``--chat-template``) when given (with ``template_kwargs``,
    ``add_generation_prompt`` True unless they say otherwise); control tokens come only from
    the template (see the module's docstring). ``add_special_tokens``: vLLM's request field,
    True or False overrides the BOS rule.

    Raises:
        ValueError: The model has no chat template (and none is given), or the template
            rejects the messages.
    """
    if chat_template is None and not tokenizer.has_chat_template:
        raise ValueError("field \"messages\": this model has no chat template; give a text "
                         "\"prompt\" (or a template: --chat-template)")
    texts = [v for m in messages for v in m.values() if isinstance(v, str)]
    find = _control_finder(tokenizer)

    def bos(text: str) -> bool:
        return _adds_bos(tokenizer, text) if add_special_tokens is None else add_special_tokens

    if not any(find(t) for t in texts):
        # nothing forged: as rendered
        text = render_chat(messages, tokenizer, template_kwargs, chat_template)
        return _encode(tokenizer, text, bos(text))
    # Each forged control string is swapped for a marker the template passes through.
    mark = next(chr(c) for c in range(0xE000, 0xF900) if not any(chr(c) in t for t in texts))
    forged: list[str] = []

    def escape(text: str) -> str:
        out, at = [], 0
        for start, end in find(text):
            forged.append(text[start:end])
            out += [text[at:start], f"{mark}{len(forged) - 1}{mark}"]
            at = end
        return "".join(out) + text[at:]

    escaped = [{k: escape(v) if isinstance(v, str) else v for k, v in m.items()}
               for m in messages]
    rendered = render_chat(escaped, tokenizer, template_kwargs, chat_template)

    def restored(span: str) -> str:
        return re.sub(f"{mark}(\\d+){mark}", lambda m: forged[int(m.group(1))], span)

    # The template's own control tokens are the only ones left in what it rendered. Each span
    # between them, row text with its forged strings put back, is encoded once as ordinary
    # text: what the same text gives as plain text, merges across a forged string's edges
    # included.
    ids, at, first = [], 0, bos(rendered)
    for start, end in [*find(rendered), (len(rendered), len(rendered))]:
        span = restored(rendered[at:start])
        ids += _encode(tokenizer, span, at == 0 and first, split=True)
        ids += _encode(tokenizer, rendered[start:end], False) if end > start else []
        at = end
    return ids


Finder = Callable[[str], list[tuple[int, int]]]
_FINDERS: dict[int, tuple[object, Finder]] = {}


def _control_finder(tokenizer) -> Finder:
    """``find(text)``: the ``(start, end)`` character spans of control tokens in ``text``,
    built once per tokenizer: the Rust tokenizer's own matching (Aho-Corasick over the added
    tokens) and its offsets, or a regex for a tokenizer without one."""
    held = _FINDERS.get(id(tokenizer))
    if held is not None and held[0] is tokenizer:
        return held[1]
    backend = getattr(getattr(tokenizer, "_tokenizer", tokenizer), "backend_tokenizer", None)
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = {i: t.content for i, t in decoder.items() if getattr(t, "special", False)}
    if backend is not None:
        def find(text: str) -> list[tuple[int, int]]:
            # NOTE: transformers leaves the backend's flag as its last encode call set it
            # (True after split_special_tokens=True); matching needs it off.
            backend.encode_special_tokens = False
            enc = backend.encode(text, add_special_tokens=False)
            # an unknown character becomes the unk token, often special: not a match
            return [(a, b) for i, (a, b) in zip(enc.ids, enc.offsets)
                    if i in special and text[a:b] == special[i]]
    else:
        controls = control_tokens(tokenizer)
        pattern = re.compile("|".join(map(re.escape, controls))) if controls else None

        def find(text: str) -> list[tuple[int, int]]:
            return [m.span() for m in pattern.finditer(text)] if pattern else []
    _FINDERS[id(tokenizer)] = (tokenizer, find)
    return find


def render_chat(messages: list[dict], tokenizer, template_kwargs: dict | None = None,
                chat_template: str | None = None) -> str:
    """The chat template's text of ``messages`` (``chat_template``: a template to use
    instead of the model's); ``template_kwargs`` (a row's ``chat_template_kwargs``) go to
    the template, ``add_generation_prompt`` True unless they say otherwise."""
    kwargs = {"add_generation_prompt": True, **(template_kwargs or {})}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as e:  # jinja2 TemplateError and friends: the row's fault
        raise ValueError(f"field \"messages\": the chat template rejected them: {e}") from e


def _adds_bos(tokenizer, text: str) -> bool:
    bos = tokenizer.bos_token
    return not (bos and text.startswith(bos))


def _encode(tokenizer, text: str, add_special_tokens: bool, split: bool = False) -> list[int]:
    if split:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens,
                                     split_special_tokens=True))
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
