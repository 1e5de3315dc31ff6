"""Output records of one input row: mlxpa result rows, or OpenAI Batch API output lines.

mlxpa rows, one per sample: the core columns of :mod:`mlxpa.data.schema`, ``sample_index``
when ``n > 1``, ``error`` for a failed row, ``logprobs`` and ``prompt_logprobs`` for rows that
ask, ``choice_logprobs``, ``choice_probs`` and ``choice_outside_prob`` for choice rows, then the
``--keep-columns`` fields. A row asked questions gets one record with ``answers``
(:mod:`mlxpa.annotation.answers`; ``label_order_changed`` with the label order check).

OpenAI Batch output, one line per input line with the ``n`` samples as ``choices``: ``{"id":
"batch_req_<row>", "custom_id", "response": {"status_code": 200, "request_id", "body": {...}},
"error": null}``, or ``"response": null`` and ``"error": {"code", "message"}`` for a failed row.
Log-probabilities take OpenAI's shapes (chat ``content``, legacy completions:
:func:`completions_logprobs`); ``prompt_logprobs`` goes where vLLM's OpenAI server puts it, in
vLLM's shape (:func:`vllm_prompt_logprobs`). The shapes, with examples:
``docs/inputs-and-outputs.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mlxpa.annotation.answers import row_answers
from mlxpa.annotation.calibration import Calibration
from mlxpa.data.rows import Row
from mlxpa.data.token_bytes import token_bytes
from mlxpa.request import SampleOutput, TokenLogprob

OUTPUT_FORMATS = ("auto", "mlxpa", "openai")
ERROR_CODE = "invalid_request"


def resolve_output_format(requested: str, file_fmt: str, existing: str | None,
                          all_openai: bool) -> str:
    """The record format of a run: ``mlxpa`` or ``openai``.

    Args:
        requested: ``--output-format``: ``auto``, ``mlxpa`` or ``openai``.
        file_fmt: The output file's format (``jsonl`` or ``parquet``).
        existing: The format of the records a resumed output holds, or None.
        all_openai: Every valid input row is an OpenAI Batch API line.

    Returns:
        ``requested`` unless ``auto``: then what a resumed output holds, else ``openai`` for
        an OpenAI Batch input written to JSONL, else ``mlxpa``.

    Raises:
        ValueError: ``openai`` to Parquet, or a format other than what the resumed output
            holds.
    """
    if requested not in OUTPUT_FORMATS:
        raise ValueError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}, "
                         f"got {requested!r}")
    if existing is not None and requested not in ("auto", existing):
        raise ValueError(f"the output holds {existing} records; cannot resume it with "
                         f"--output-format {requested}")
    fmt = requested if requested != "auto" else existing or (
        "openai" if all_openai and file_fmt == "jsonl" else "mlxpa")
    if fmt == "openai" and file_fmt != "jsonl":
        raise ValueError("--output-format openai writes JSONL; give a .jsonl output")
    return fmt


def error_records(row: Row, message: str, fmt: str,
                  prompt_tokens: int | None = None) -> list[dict]:
    """The output of a row that could not run (one record, whatever its ``n``).

    Args:
        row: The input row.
        message: Why, with file, line and field.
        fmt: ``"mlxpa"`` or ``"openai"``.
        prompt_tokens: Its prompt length when it was tokenized.
    """
    if fmt == "openai":
        return [_openai_line(row, None, {"code": ERROR_CODE, "message": message})]
    return [_keep(row, {"id": row.id, "text": None, "finish_reason": "error",
                        "prompt_tokens": prompt_tokens, "completion_tokens": 0,
                        "cached_tokens": 0, "error": message})]


def result_records(row: Row, outs: list[SampleOutput], fmt: str, model: str,
                   place: str, tokenizer: Any = None, *, calibration: Calibration | None = None,
                   permute: bool = False) -> list[dict]:
    """The output of a finished row: every sample's :class:`SampleOutput`, in sample order.

    Args:
        row: The input row.
        outs: One output per sample, sorted by ``sample_index``.
        fmt: ``"mlxpa"`` or ``"openai"``.
        model: Model name for OpenAI lines.
        place: Where the row came from (``file line 3``), put before a run-time error.
        tokenizer: The model's tokenizer (``decode``; a token's text in ``logprobs``).
        calibration: Applied to the answers of a row asked questions (None: raw).
        permute: The row's questions were also scored with their labels listed in a second
            order (the label order check).
    """
    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)

    def own_bytes(token_id: int) -> list[int]:
        raw = (token_bytes(tokenizer, token_id) if tokenizer is not None
               else str(token_id).encode("utf-8"))
        return list(raw)

    failed = next((o for o in outs if o.error is not None), None)
    if failed is not None:
        return error_records(row, f"{place}: {failed.error}", fmt,
                             failed.num_prompt_tokens)
    if row.questions is not None and outs and outs[0].question_scores is not None:
        try:
            return [answer_record(row, outs[0], calibration, permute)]
        except ValueError as e:
            return error_records(row, f"{place}: --calibration: {e}", fmt,
                                 outs[0].num_prompt_tokens)
    if fmt == "openai":
        return [_openai_line(row, _openai_body(row, outs, model, token_text, own_bytes), None)]
    records = []
    for out in outs:
        record = {"id": row.id, "text": out.text, "finish_reason": out.finish_reason,
                  "prompt_tokens": out.num_prompt_tokens,
                  "completion_tokens": len(out.token_ids),
                  "cached_tokens": out.num_cached_tokens}
        if len(outs) > 1:
            record["sample_index"] = out.sample_index
        if out.logprobs is not None:
            record["logprobs"] = [_entry(lp, token_text) for lp in out.logprobs]
        if out.prompt_logprobs is not None:
            record["prompt_logprobs"] = [None if lp is None else _entry(lp, token_text)
                                         for lp in out.prompt_logprobs]
        record.update(choice_fields(out))
        records.append(_keep(row, record))
    return records


def answer_record(row: Row, out: SampleOutput, calibration: Calibration | None = None,
                  permute: bool = False) -> dict:
    """The record of a row asked questions: its ``answers`` from the output's
    ``question_scores`` (:func:`mlxpa.annotation.answers.row_answers`).

    Raises:
        ValueError: The calibration's labels for a question are not the row's.
    """
    scores = [(list(s.logprobs.values()), s.outside_prob) for s in out.question_scores]
    answers, changed = row_answers(row.questions, scores, calibration, permute)
    record = {"id": row.id, "text": "", "finish_reason": out.finish_reason,
              "prompt_tokens": out.num_prompt_tokens, "completion_tokens": 0,
              "cached_tokens": out.num_cached_tokens, "answers": answers}
    if changed is not None:
        record["label_order_changed"] = changed
    return _keep(row, record)


def choice_fields(out: SampleOutput) -> dict[str, Any]:
    """A choice row's label probabilities (none for other rows): ``choice_logprobs``,
    ``choice_probs``, ``choice_outside_prob``."""
    if out.choice_logprobs is None:
        return {}
    return {"choice_logprobs": out.choice_logprobs, "choice_probs": out.choice_probs,
            "choice_outside_prob": out.choice_outside_prob}


def _keep(row: Row, record: dict) -> dict:
    return {**record, **row.keep} if row.keep else record


def _openai_line(row: Row, body: dict | None, error: dict | None) -> dict:
    response = None
    if body is not None:
        response = {"status_code": 200, "request_id": f"req_{row.index}", "body": body}
    return _keep(row, {"id": f"batch_req_{row.index}", "custom_id": row.id,
                       "response": response, "error": error})


def _entry(lp: TokenLogprob, token_text: Callable[[int], str],
           own_bytes: Callable[[int], list[int]] | None = None) -> dict:
    """One token's logprobs entry (OpenAI's shape; ``bytes``, the token's own UTF-8 bytes
    (:mod:`mlxpa.data.token_bytes`), when ``own_bytes`` is given: OpenAI lines only)."""
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
    UTF-8 bytes, :mod:`mlxpa.data.token_bytes`)."""
    return {"content": [_entry(lp, token_text, own_bytes) for lp in logprobs]}


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


def _openai_body(row: Row, outs: list[SampleOutput], model: str, token_text: Callable[[int], str],
                 own_bytes: Callable[[int], list[int]]) -> dict[str, Any]:
    chat = row.openai == "chat" if row.openai else row.messages is not None
    choices = []
    for out in outs:
        choice: dict[str, Any] = {"index": out.sample_index}
        if chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        logprobs = None
        if out.logprobs is not None and chat:
            logprobs = chat_logprobs(out.logprobs, token_text, own_bytes)
        elif out.logprobs is not None:
            logprobs = completions_logprobs(out.logprobs, token_text)
        choice.update(logprobs=logprobs, finish_reason=out.finish_reason)
        if out.prompt_logprobs is not None and not chat:  # vLLM: in each completion choice
            choice["prompt_logprobs"] = vllm_prompt_logprobs(out.prompt_logprobs, token_text)
        choice.update(choice_fields(out))
        choices.append(choice)
    prompt = outs[0].num_prompt_tokens
    completion = sum(len(o.token_ids) for o in outs)
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{row.index}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": outs[0].num_cached_tokens}}}
    if outs[0].prompt_logprobs is not None and chat:  # vLLM: in the chat completion's body
        body["prompt_logprobs"] = vllm_prompt_logprobs(outs[0].prompt_logprobs, token_text)
    return body
