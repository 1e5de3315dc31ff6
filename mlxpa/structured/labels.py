"""Where the tokens of a ``choice`` row's labels start and end after its prompt.

Rule: label ``c`` after a prompt whose text is ``T`` is scored as the tokenizer's encoding of
``T + c`` (spaces exactly as the label writes them), from the first token where that encoding
leaves the prompt's own tokens, so a prompt's trailing characters that the tokenizer merges
with the label go to the label (Gemma's ``"Answer: "`` ends in ``"▁"``, and ``"Paris"`` is
scored as ``"▁Paris"``; lm-evaluation-harness's ``_encode_pair`` moves trailing spaces for the
same reason). All labels of a row are scored from one position, the earliest at which any of
them leaves the prompt, so their scores are probabilities of texts after one context.

The prompt's text is recovered from its tail: its last tokens after its last control token
(at most :data:`TAIL_TOKENS`, never a BOS the tokenizer adds), the longest suffix of them whose
text encodes back to the same tokens; with none, a label is its own encoding, appended. Joins
are cached by tail and labels, so rows that end alike cost one encoding per label. No mlx here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from mlxpa.messages import quote_value
from mlxpa.sampling_params import StructuredOutput

# Most prompt tokens a label's join looks back over (the tail).
TAIL_TOKENS = 16
_CACHE_SIZE = 4096


class LabelTokens(NamedTuple):
    """A row's labels as token ids after its prompt.

    Attributes:
        start: Prompt position the labels are scored from (``<= len(prompt)``): each label's
            tokens follow ``prompt[:start]``.
        tokens: Per label, in the labels' order, its token ids from ``start`` (non-empty).
    """

    start: int
    tokens: tuple[tuple[int, ...], ...]


class LabelJoiner:
    """Joins labels to prompts by the rule of the module docstring, for one tokenizer.

    Args:
        tokenizer: An mlx-lm ``TokenizerWrapper`` or a Hugging Face tokenizer (``encode``,
            ``decode``, ``all_special_ids``).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)
        decoder = getattr(self._hf, "added_tokens_decoder", None) or {}
        self._special = frozenset(getattr(self._hf, "all_special_ids", None) or ()) | {
            i for i, t in decoder.items() if getattr(t, "special", False)}
        self._joins: dict[tuple, tuple[int, tuple[tuple[int, ...], ...]]] = {}

    def join(self, prompt_ids: Sequence[int], labels: Sequence[str]) -> LabelTokens:
        """The labels' tokens after ``prompt_ids``.

        Raises:
            ValueError: A label has no token of its own after the prompt, or two labels are
                the same tokens (both named).
        """
        n = len(prompt_ids)
        first = max(1, n - TAIL_TOKENS)
        anchor = next((i for i in range(n - 1, first - 1, -1)
                       if prompt_ids[i] in self._special), first)
        key = (tuple(prompt_ids[anchor:]), tuple(labels))
        joined = self._joins.get(key)
        if joined is None:
            if len(self._joins) >= _CACHE_SIZE:
                self._joins.clear()
            joined = self._joins[key] = self._join_tail(key[0], key[1])
        back, tokens = joined
        return LabelTokens(n - back, tokens)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids (one batched call into the tokenizer)."""
        return [list(ids) for ids in self._hf(texts, add_special_tokens=False)["input_ids"]]

    def _join_tail(self, tail: tuple[int, ...],
                   labels: tuple[str, ...]) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """``(tail tokens the labels take over, each label's tokens)``."""
        for k in range(len(tail), -1, -1):
            window = tail[len(tail) - k:]
            text = self._hf.decode(list(window), skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False) if k else ""
            own, *encodings = self._encode([text, *(text + label for label in labels)])
            if own == list(window):
                break
        keep = min(_common_prefix(e, window) for e in encodings)
        tokens = tuple(tuple(e[keep:]) for e in encodings)
        seen: dict[tuple[int, ...], str] = {}
        for label, ids in zip(labels, tokens):
            if len(ids) == 0:
                raise ValueError(f"label {quote_value(label)} has no token of its own after the "
                                 "prompt")
            if ids in seen:
                first, this = quote_value(seen[ids]), quote_value(label)
                raise ValueError(f"labels {first} and {this} are the same tokens after the "
                                 f"prompt ({list(ids)})")
            seen[ids] = label
        return len(window) - keep, tokens


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def source_name(so: StructuredOutput) -> str:
    """Where ``so`` was given, as messages name it: ``field "guided_choice"`` or the CLI
    option (``--choice``)."""
    source = so.source or "structured_outputs"
    return source if source.startswith("--") else f'field "{source}"'


def choice_label_checker(get_tokenizer: Callable[[], Any],
                         prompt_ids: Callable[[Any, Any], list[int]],
                         default: StructuredOutput | None) -> Callable[[Any], str | None]:
    """A validation-pass check of ``choice`` rows: ``check(row)`` says why the row's labels
    cannot be scored after its prompt (two labels that are the same tokens there, or a
    label with no token of its own: :meth:`LabelJoiner.join`), naming the field that gave
    them, else None.

    Args:
        get_tokenizer: Called once, at the first choice row; None from it turns the check
            off (the model's load reports why).
        prompt_ids: ``prompt_ids(row, tokenizer)``, the row's prompt token ids as the run
            builds them (a ``ValueError`` from it is left to the prompt's own check).
        default: The run's default constraint, for rows that give none.
    """
    held: list[tuple[Any, LabelJoiner] | None] = []

    def check(row: Any) -> str | None:
        so = row.params.get("structured_outputs", default)
        if so is None or so.kind != "choice":
            return None
        if not held:
            tokenizer = get_tokenizer()
            held.append((tokenizer, LabelJoiner(tokenizer)) if tokenizer is not None else None)
        if held[0] is None:
            return None
        tokenizer, joiner = held[0]
        try:
            ids = prompt_ids(row, tokenizer)
        except ValueError:
            return None
        try:
            joiner.join(ids, so.choices)
        except ValueError as e:
            return f"{source_name(so)}: {e}"
        return None

    return check
