"""A token's own UTF-8 bytes, OpenAI's logprobs ``bytes``.

OpenAI defines a logprobs entry's ``bytes`` as the token's UTF-8 bytes, so that the bytes of
the tokens that split one character (an emoji, a rare rune) join into it. A token's decoded
text cannot give them: a byte-fallback token (SentencePiece's ``<0xF0>``) or a byte-level BPE
token holding part of a character decodes to U+FFFD. Those tokens' bytes come from the
vocabulary instead: the byte a ``<0xHH>`` token names, or the bytes GPT-2's byte-to-character
table (``transformers``' ``bytes_to_unicode``) maps a byte-level token's characters back to.
Every other token's bytes are its decoded text's, so ``token`` and ``bytes`` agree.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The UTF-8 bytes of one token.

    Args:
        tokenizer: A Hugging Face tokenizer or mlx-lm's ``TokenizerWrapper`` (``decode``,
            ``convert_ids_to_tokens``).
        token_id: The token.

    Returns:
        Its decoded text's bytes, or, when that text holds U+FFFD (part of a character), the
        raw bytes the vocabulary entry stands for.
    """
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text.encode("utf-8")
    raw = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(raw, str):
        return text.encode("utf-8")
    match = _BYTE_TOKEN.fullmatch(raw)
    if match:
        return bytes([int(match[1], 16)])
    decoder = _byte_level_decoder()
    if raw and all(c in decoder for c in raw):
        return bytes(decoder[c] for c in raw)
    return text.encode("utf-8")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level vocabulary alphabet: character -> the byte it stands for."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}
