"""One input record (a JSON object, a Parquet/CSV/``datasets`` row) to a :class:`Row`: the file
envelope around the request schema (:func:`mlxpa.inputs.schema.parse_request`, which reads
the prompt, sampling, constraint and question fields). The envelope adds what only a file
has: the id column (default: the row index), OpenAI Batch lines (``custom_id``, ``method``,
``url`` around a ``body``), the ``--keep-columns`` values, and the place of each problem
(source and line or row), so a validation pass can list every problem before any model work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlxpa.data.reader_options import RowSpec, where
from mlxpa.inputs.schema import ParsedRequest, parse_request
from mlxpa.messages import field_error_text, quote_value, surrogate_problem

if TYPE_CHECKING:
    from mlxpa.annotation.questions import QuestionSet

OPENAI_URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass(frozen=True, slots=True)
class Row:
    """One input row, read.

    Attributes:
        index: 0-based position among the input's rows (blank JSONL lines skipped).
        id: The row's id field (str or int); defaults to ``index``; None for a record that
            could not be decoded.
        prompt: Text prompt, or None when ``messages`` or ``prompt_token_ids`` is given.
        messages: Chat messages (``[{"role": str, "content": str, ...}]``, null keys dropped),
            or None.
        params: The sampling fields the row sets, each checked by its rule (nulls are
            absent), by ``SamplingParams`` field name; JSON's spellings read as the field's
            type (``10.0`` as an int, one ``stop`` string as a list, ``logit_bias`` keys as
            ints); see :class:`~mlxpa.inputs.schema.ParsedRequest`.
        error: Why the row cannot run (the full message with source, line and field), or None.
            When set, ``prompt``, ``messages`` and ``params`` hold only what was valid.
        line: Where the row came from: 1-based line (JSONL, CSV) or 0-based row (Parquet,
            ``datasets``).
        keep: Values of the ``--keep-columns`` fields (None for a missing one), or None when
            no columns are kept.
        openai: ``"chat"`` or ``"completions"`` for an OpenAI Batch API line, else None.
        prompt_token_ids: The prompt as token ids (ints >= 0; checked against the model's
            vocabulary later), or None.
        chat_template_kwargs: Keyword arguments of the chat template for ``messages``
            (``add_generation_prompt`` among them when the row sets it), or None.
        questions: The questions the row is asked (its ``questions`` field, else the run's
            set), or None: the row is generated.
        gold: Question name to the index of its gold label, for the questions that have one
            (None when the row is asked no question).
        add_special_tokens: vLLM's field: False encodes the prompt without special tokens.
        cache_salt: vLLM's field: the row shares prefix-cache blocks only with rows (and
            requests) of the same salt; None: unsalted.
    """

    index: int
    id: str | int | None
    prompt: str | None
    messages: list[dict] | None
    params: dict[str, Any]
    error: str | None = None
    line: int | None = None
    keep: dict[str, Any] | None = None
    openai: str | None = None
    prompt_token_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    questions: QuestionSet | None = None
    gold: dict[str, int] | None = None
    add_special_tokens: bool | None = None
    cache_salt: str | None = None

    def as_request(self) -> ParsedRequest:
        """The row's request, as the input processor takes it."""
        return ParsedRequest(self.id, self.prompt, self.messages, self.prompt_token_ids,
                             self.chat_template_kwargs, self.params, self.questions, self.gold,
                             self.openai, add_special_tokens=self.add_special_tokens,
                             prefix="body." if self.openai is not None else "",
                             cache_salt=self.cache_salt)


def parse_row(obj: dict[str, Any], index: int, line: int, spec: RowSpec) -> Row:
    """Read one decoded record (a JSON object or a columnar row; None means absent)."""
    problem = surrogate_problem(obj)
    if problem is not None:  # no string of it reaches a tokenizer, a message or the output
        return bad_record_row(problem, index, line, spec)
    problems: list[str] = []
    request_spec, fields = spec.options.request_spec, obj
    openai = "body" in obj and ("custom_id" in obj or "url" in obj or "method" in obj)
    if openai:  # an OpenAI Batch API line: its body is the request
        fields, row_id, kind = obj.get("body"), obj.get("custom_id"), _check_openai(obj, problems)
        if row_id is not None and (isinstance(row_id, bool) or not isinstance(row_id, (str, int))):
            problems.append(field_error_text("custom_id", "a string or an integer", row_id))
            row_id = index  # None (no custom_id): unknown, never the index (another row's id)
        if not isinstance(fields, dict):
            problems.append(field_error_text("body", "an object", fields))
            fields = {}
        request_spec = request_spec._replace(
            id_field=None, questions=None, keep=(), body=True, api=kind, prefix="body.",
            route=f'field "url" {quote_value(obj.get("url"))}')
    request = parse_request(fields, request_spec, index=index, problems=problems)
    keep = None
    if spec.options.keep_columns:
        keep = {c: obj[c] if c in obj else fields.get(c) for c in spec.options.keep_columns}
    error = f"{where(spec.source, line, spec.unit)}: {'; '.join(problems)}" if problems else None
    return Row(index, row_id if openai else request.id, request.prompt, request.messages,
               request.params, error, line, keep, request.api, request.prompt_token_ids,
               request.chat_template_kwargs, request.questions, request.gold,
               request.add_special_tokens, request.cache_salt)


def bad_record_row(detail: str, index: int, line: int, spec: RowSpec) -> Row:
    """A row for a record that could not be decoded (invalid JSON, not an object, bad UTF-8,
    a lone surrogate); its id is None (unknown: never the index, which could be another row's
    id)."""
    return Row(index, None, None, None, {}, f"{where(spec.source, line, spec.unit)}: {detail}",
               line)


def _check_openai(obj: dict, problems: list[str]) -> str | None:
    """The kind of an OpenAI Batch line (``chat``, ``completions``, or None when its url is
    absent or wrong); problems with ``custom_id``, ``method`` and ``url`` are appended."""
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        problems.append(field_error_text("custom_id", "a non-empty string", cid))
    method = obj.get("method")
    if method is not None and method != "POST":
        problems.append(field_error_text("method", '"POST"', method))
    url = obj.get("url")
    if url is None:
        return None
    if url not in OPENAI_URLS:
        problems.append(field_error_text("url", " or ".join(f'"{u}"' for u in OPENAI_URLS), url))
        return None
    return OPENAI_URLS[url]
