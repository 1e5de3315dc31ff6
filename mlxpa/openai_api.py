"""The OpenAI API's response shapes as plain dicts, stated once for both skins: the server's
JSON answers and stream chunks (:mod:`mlxpa.entrypoints.openai.serving`) and the file run's
``--output-format openai`` lines (:mod:`mlxpa.data.records`), as vLLM's ``run_batch`` answers
with its server's shapes. A token's ``bytes`` are its own UTF-8 bytes (:func:`token_bytes`).
Examples: ``docs/inputs-and-outputs.md``.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

from mlxpa.request import SampleOutput, TokenLogprob

TokenText = Callable[[int], str]  # a token id's text
TokenBytes = Callable[[int], list[int]]  # a token id's own UTF-8 bytes


class Tokens:
    """A tokenizer's text and bytes of one token (its id's text without a tokenizer)."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else str(token_id)

    def bytes(self, token_id: int) -> list[int]:
        raw = (token_bytes(self.tokenizer, token_id) if self.tokenizer is not None
               else str(token_id).encode("utf-8"))
        return list(raw)


def completion_body(outs: list[SampleOutput], chat: bool, model: str, response_id: str,
                    tokens: Tokens) -> dict[str, Any]:
    """A chat completion's or a completion's whole body (``chat.completion`` /
    ``text_completion``) of a request's finished samples, in sample order: choices with
    their text, log-probabilities and label probabilities, vLLM's ``prompt_logprobs``,
    usage."""
    choices = []
    for out in outs:
        choice: dict[str, Any] = {"index": out.sample_index}
        if chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        logprobs = None
        if out.logprobs is not None and chat:
            logprobs = chat_logprobs(out.logprobs, tokens.text, tokens.bytes)
        elif out.logprobs is not None:
            logprobs = completions_logprobs(out.logprobs, tokens.text)
        choice.update(logprobs=logprobs, finish_reason=out.finish_reason)
        if out.prompt_logprobs is not None and not chat:  # vLLM: in each completion choice
            choice["prompt_logprobs"] = vllm_prompt_logprobs(out.prompt_logprobs, tokens.text)
        choice.update(choice_fields(out))
        choices.append(choice)
    body = {"id": response_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(outs[0].num_prompt_tokens, sum(len(o.token_ids) for o in outs),
                           outs[0].num_cached_tokens)}
    if outs[0].prompt_logprobs is not None and chat:  # vLLM: in the chat completion's body
        body["prompt_logprobs"] = vllm_prompt_logprobs(outs[0].prompt_logprobs, tokens.text)
    return body


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def choice_fields(out: SampleOutput) -> dict[str, Any]:
    """A choice row's label probabilities (none for other rows): ``choice_logprobs``,
    ``choice_probs``, ``choice_outside_prob``."""
    if out.choice_logprobs is None:
        return {}
    return {"choice_logprobs": out.choice_logprobs, "choice_probs": out.choice_probs,
            "choice_outside_prob": out.choice_outside_prob}


def token_entry(lp: TokenLogprob, token_text: Callable[[int], str],
           own_bytes: Callable[[int], list[int]] | None = None) -> dict:
    """One token's logprobs entry (OpenAI's shape; ``bytes``, the token's own UTF-8 bytes
    (:func:`token_bytes`), when ``own_bytes`` is given: OpenAI lines only)."""
    def one(token_id: int, logprob: float) -> dict:
        d: dict[str, Any] = {"token": token_text(token_id), "logprob": logprob}
        if own_bytes is not None:
            d["bytes"] = own_bytes(token_id)
        return d

    return {**one(lp.token_id, lp.logprob),
            "top_logprobs": [one(t, v) for t, v in lp.top]}


def chat_logprobs(logprobs: list[TokenLogprob], token_text: Callable[[int], str],
                  own_bytes: Callable[[int], list[int]]) -> dict[str, list]:
    """OpenAI's chat ``logprobs`` object for tokens: ``{"content": [{"token", "logprob",
    "bytes", "top_logprobs": [...]}]}``, one entry per token (``own_bytes``: a token's own
    UTF-8 bytes, :func:`token_bytes`)."""
    return {"content": [token_entry(lp, token_text, own_bytes) for lp in logprobs]}


def completions_logprobs(logprobs: list[TokenLogprob],
                         token_text: Callable[[int], str]) -> dict[str, list]:
    """OpenAI's completions ``logprobs`` object for one choice's tokens.

    Args:
        logprobs: One :class:`TokenLogprob` per generated token.
        token_text: A token id's text.

    Returns:
        ``{"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
        "text_offset": [int]}``, one entry per token: its text, its log-probability, its most
        likely alternatives by text (most likely first; of alternatives with the same text the
        more likely one is kept, a dict holding one value per key) and the character offset of
        its text in the completion (vLLM's rule without ``echo``: 0 for the first token, then
        the sum of the previous tokens' text lengths).
    """
    tokens = [token_text(lp.token_id) for lp in logprobs]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    tops = []
    for lp in logprobs:
        top: dict[str, float] = {}
        for token_id, value in lp.top:
            top.setdefault(token_text(token_id), value)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": tops, "text_offset": offsets}


def vllm_prompt_logprobs(logprobs: list[TokenLogprob | None],
                         token_text: Callable[[int], str]) -> list[dict[str, dict] | None]:
    """vLLM's OpenAI-server ``prompt_logprobs`` of one prompt.

    Args:
        logprobs: One entry per prompt token (None for the first, which nothing precedes).
        token_text: A token id's text.

    Returns:
        Per prompt token, None or ``{"<token id>": {"logprob", "rank", "decoded_token"}}``
        holding the prompt token and then its alternatives (rank 1 = most likely), as
        vLLM's ``list[dict[int, Logprob] | None]`` serialises (JSON keys are strings).
    """
    out: list[dict[str, dict] | None] = []
    for lp in logprobs:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): {"logprob": lp.logprob, "rank": lp.rank,
                                    "decoded_token": token_text(lp.token_id)}}
        for rank, (token_id, value) in enumerate(lp.top, 1):
            entry.setdefault(str(token_id), {"logprob": value, "rank": rank,
                                             "decoded_token": token_text(token_id)})
        out.append(entry)
    return out


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The UTF-8 bytes of one token (OpenAI's logprobs ``bytes``: the bytes of the tokens
    that split one character join into it). A token whose text holds U+FFFD (part of a
    character) takes its bytes from the vocabulary: the byte a ``<0xHH>`` token names, or
    GPT-2's byte-level alphabet mapped back (``transformers``' ``bytes_to_unicode``).

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
