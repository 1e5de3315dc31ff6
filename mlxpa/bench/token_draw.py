"""Random prompt token ids that every system reads back as the same ids.

vLLM's random dataset draws ids from the vocabulary and sends their decoded text; a server
tokenizes that text again. Ids drawn blindly do not survive the trip: an added token such as
Gemma's ``<unused4369>`` is not among ``all_special_ids``, and its text is one token to a
tokenizer that parses added tokens (mlx-lm) but several to one that reads a message's text as
text (mlxpa); a byte-fallback id decodes to part of a character; two neighbours' texts may
merge into another token; a chat template may trim a message's leading or trailing space.
So the two servers of a sitting did not prefill the same prompts (643 against 567 tokens).

:class:`TokenDraw` draws from the ordinary vocabulary (no special, added or byte-fallback
tokens, nor byte-level pieces that are part of a character), then re-encodes the text and
keeps the result only at a fixed point: ``encode(decode(ids)) == ids`` for the piece alone and
after the prefix it follows, with no space at either end of its text. Each retry keeps the
stable part and draws the rest again (bounded).
"""

from __future__ import annotations

import functools
import json
import re

import numpy as np

MAX_TRIES = 500
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def excluded_ids(tokenizer, vocab: int) -> set[int]:
    """Ids below ``vocab`` a synthetic prompt never draws: special tokens, added tokens (the
    tokenizer's ``get_added_vocab()``), SentencePiece byte-fallback pieces (``<0x41>``) and,
    for a byte-level BPE, pieces whose bytes are not whole UTF-8 characters."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "get_added_vocab", None)
    if added is not None:
        ids.update(added().values())
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocab)))
    ids.update(i for i, p in enumerate(pieces)
               if isinstance(p, str) and p[:3] == "<0x" and _BYTE_PIECE.match(p))
    if _byte_level(tokenizer):  # GPT-2's byte-level BPE: pieces that are part of a character
        to_byte = {c: b for b, c in byte_level_alphabet().items()}
        for i, p in enumerate(pieces):
            if isinstance(p, str) and all(c in to_byte for c in p):
                try:
                    bytes(to_byte[c] for c in p).decode("utf-8")
                except UnicodeDecodeError:
                    ids.add(i)
    return ids


def _byte_level(tokenizer) -> bool:
    """Whether a Hugging Face fast tokenizer decodes with GPT-2's byte-level decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        backend = getattr(getattr(tokenizer, "_tokenizer", None), "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return decoder.get("type") == "ByteLevel"


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in chars:
            chars[b], n = chr(256 + n), n + 1
    return chars


def vocab_size(tokenizer) -> int:
    """Ids of the vocabulary, added tokens included."""
    return len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else tokenizer.vocab_size


class TokenDraw:
    """Draws token ids that round-trip through the tokenizer (see the module).

    Args:
        tokenizer: A Hugging Face tokenizer (or mlx-lm's wrapper of one).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        ids = np.arange(vocab := vocab_size(tokenizer))
        self.excluded = excluded_ids(tokenizer, vocab)
        self.pool = ids[~np.isin(ids, np.fromiter(self.excluded, dtype=np.int64))]
        if self.pool.size == 0:
            raise ValueError("the tokenizer has no ordinary token to draw prompts from")

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, no special tokens added."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def round_trips(self, ids: list[int], prefix: list[int] = ()) -> bool:
        """Whether ``ids`` encode back to themselves, alone and after ``prefix``, use no
        excluded id, and decode to text without a space at either end."""
        text = self.tokenizer.decode(ids)
        prefix = list(prefix)
        return (text == text.strip() and not self.excluded.intersection(ids)
                and self.encode(text) == list(ids)
                and (not prefix or self.encode(self.tokenizer.decode(prefix + list(ids)))
                     == prefix + list(ids)))

    def draw(self, rng: np.random.Generator, n: int, prefix: list[int] = ()) -> list[int]:
        """``n`` ids that :meth:`round_trips` (after ``prefix``: ids without a BOS).

        Raises:
            RuntimeError: No such ids in :data:`MAX_TRIES` tries (a tokenizer whose text
                never settles).
        """
        prefix = list(prefix)
        cur: list[int] = []
        for _ in range(MAX_TRIES):
            cur = cur + rng.choice(self.pool, size=n - len(cur)).tolist()
            if self.round_trips(cur, prefix):
                return cur
            cur = self._stable_part(cur, prefix, n)
        raise RuntimeError(f"no {n} token ids that encode back to themselves in "
                           f"{MAX_TRIES} tries")

    def _stable_part(self, cur: list[int], prefix: list[int], n: int) -> list[int]:
        """What to keep of ``cur`` for the next try: its re-encoding after the prefix, cut to
        ``n`` less the last token (which a cut may have split), without excluded ids or a
        leading space."""
        text = self.tokenizer.decode(cur)
        if not text or text[0].isspace():
            return []
        again = self.encode(self.tokenizer.decode(prefix + cur))
        if again[:len(prefix)] != prefix:
            return []
        kept = [i for i in again[len(prefix):] if i not in self.excluded][:n]
        return kept[:-1]


@functools.lru_cache(maxsize=4)
def token_draw(tokenizer) -> TokenDraw:
    """The :class:`TokenDraw` of ``tokenizer``, built once (its vocabulary scan takes about a
    second on a 262k vocabulary)."""
    return TokenDraw(tokenizer)
