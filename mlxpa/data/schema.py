"""The output schema, defined once: the core columns of a result record and their types.

Every mlxpa result record starts with these columns (JSONL keys, Parquet columns in this order);
extra keys (``sample_index``, ``--keep-columns`` fields) follow. ``id`` is an int or a string
(Parquet: ``int64`` until a string id appears, then ``string``), so its type is None here.
"""

from __future__ import annotations

from typing import Any

CORE_TYPES: dict[str, type | None] = {
    "id": None,
    "text": str,
    "finish_reason": str,
    "prompt_tokens": int,
    "completion_tokens": int,
    "cached_tokens": int,
    "error": str,
}
CORE_COLUMNS = tuple(CORE_TYPES)

# Columns of per-token log-probabilities, each a list (null entries allowed: the first
# prompt token's) of ``{"token": str, "logprob": float, "top_logprobs": [{"token": str,
# "logprob": float}]}``; Parquet stores them with this one type whatever a row group holds
# (a group whose rows ask for no alternatives would otherwise infer another).
TOKEN_LOGPROB_COLUMNS = ("logprobs", "prompt_logprobs")
# A choice row's label probabilities (label to value; the outside mass a float): mlxpa rows
# and each choice of an OpenAI Batch line; Parquet stores the first two as structs of
# doubles (a string of JSON where the label sets of row groups differ).
CHOICE_FIELDS = ("choice_logprobs", "choice_probs", "choice_outside_prob")
# Every field name an output record can have (mlxpa rows, OpenAI Batch lines): a kept input
# column may not take one of these names.
# A row asked questions: its answers, and the label order check's changed questions.
ANSWER_FIELDS = ("answers", "label_order_changed")
OUTPUT_FIELDS = frozenset((*CORE_COLUMNS, "sample_index", "custom_id", "response",
                           *TOKEN_LOGPROB_COLUMNS, *CHOICE_FIELDS, *ANSWER_FIELDS))


def id_key(value: Any) -> str:
    """An id as compared across runs and formats (its text: ``7`` and ``"7"`` are one id)."""
    return str(value)
