"""Output records of one input row: mlxpa result rows (one per sample: the core columns of
:mod:`mlxpa.data.schema`, ``sample_index`` when ``n > 1``, log-probabilities, a choice row's
label probabilities, a row's ``answers``, then the ``--keep-columns`` fields), or OpenAI Batch
output lines around the server's own response body (:mod:`mlxpa.openai_api`). Examples:
``docs/inputs-and-outputs.md``.
"""

from __future__ import annotations

from typing import Any

from mlxpa.annotation.answers import RowAnswers, answers_of
from mlxpa.annotation.calibration import Calibration
from mlxpa.data.rows import Row
from mlxpa.openai_api import Tokens, choice_fields, completion_body, token_entry
from mlxpa.request import SampleOutput

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
                   permute: bool = False, answers: RowAnswers | str | None = None) -> list[dict]:
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
        answers: The answers of a row asked questions when the caller has them already
            (:func:`row_answers_of` with ``calibration`` and ``permute``); None: computed here.
    """
    tokens = Tokens(tokenizer)
    if answers is None:
        answers = row_answers_of(row, outs, calibration, permute)
    failed = next((o for o in outs if o.error is not None), None)
    if failed is not None:
        return error_records(row, f"{place}: {failed.error}", fmt,
                             failed.num_prompt_tokens)
    if isinstance(answers, str):
        return error_records(row, f"{place}: --calibration: {answers}", fmt,
                             outs[0].num_prompt_tokens)
    if answers is not None:
        return [answer_record(row, outs[0], answers)]
    if fmt == "openai":
        chat = row.openai == "chat" if row.openai else row.messages is not None
        body = completion_body(outs, chat, model, f"{'chatcmpl' if chat else 'cmpl'}-{row.index}",
                               tokens)
        return [_openai_line(row, body, None)]
    records = []
    for out in outs:
        record = {"id": row.id, "text": out.text, "finish_reason": out.finish_reason,
                  "prompt_tokens": out.num_prompt_tokens,
                  "completion_tokens": len(out.token_ids),
                  "cached_tokens": out.num_cached_tokens}
        if len(outs) > 1:
            record["sample_index"] = out.sample_index
        if out.logprobs is not None:
            record["logprobs"] = [token_entry(lp, tokens.text) for lp in out.logprobs]
        if out.prompt_logprobs is not None:
            record["prompt_logprobs"] = [None if lp is None else token_entry(lp, tokens.text)
                                         for lp in out.prompt_logprobs]
        record.update(choice_fields(out))
        records.append(_keep(row, record))
    return records


def row_answers_of(row: Row, outs: list[SampleOutput], calibration: Calibration | None = None,
                   permute: bool = False) -> RowAnswers | str | None:
    """The answers of a finished row asked questions (:func:`mlxpa.annotation.answers
    .answers_of` of its output's label scores), why they cannot be given (a calibration whose
    labels are not the row's), or None for any other row or a failed one."""
    if row.questions is None or not outs or outs[0].question_scores is None:
        return None
    try:
        return answers_of(row.questions, outs[0].question_scores, calibration, permute)
    except ValueError as e:
        return str(e)


def answer_record(row: Row, out: SampleOutput, answers: RowAnswers) -> dict:
    """The record of a row asked questions: its ``answers`` (and ``label_order_changed`` with
    the label order check)."""
    record = {"id": row.id, "text": "", "finish_reason": out.finish_reason,
              "prompt_tokens": out.num_prompt_tokens, "completion_tokens": 0,
              "cached_tokens": out.num_cached_tokens, "answers": answers.answers}
    if answers.changed is not None:
        record["label_order_changed"] = answers.changed
    return _keep(row, record)


def _keep(row: Row, record: dict) -> dict:
    return {**record, **row.keep} if row.keep else record


def _openai_line(row: Row, body: dict | None, error: dict | None) -> dict:
    response = None
    if body is not None:
        response = {"status_code": 200, "request_id": f"req_{row.index}", "body": body}
    return _keep(row, {"id": f"batch_req_{row.index}", "custom_id": row.id,
                       "response": response, "error": error})


