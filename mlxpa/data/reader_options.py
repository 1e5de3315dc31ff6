"""How to read an input: :class:`InputOptions` (the reader settings, defined once),
:class:`RowSpec` (those settings for one source), :class:`InputError`, and the column checks
every columnar reader (Parquet, CSV, ``datasets``) runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from mlxpa.data.schema import OUTPUT_FIELDS
from mlxpa.inputs.schema import RequestSpec, known_fields
from mlxpa.inputs.unsupported import sampling_like

if TYPE_CHECKING:
    from mlxpa.annotation.questions import QuestionSet

FORMATS = ("jsonl", "parquet", "csv", "txt", "hf")


class InputError(ValueError):
    """A problem with the input as a whole (the run cannot read it).

    ``str(error)`` is the full message, e.g. ``data.parquet: not a readable Parquet file``.

    Attributes:
        source: The file name as given, or ``"<stdin>"``.
        line: 1-based line (JSONL, CSV) or 0-based row (Parquet, ``datasets``); None when the
            problem is with the whole file.
    """

    def __init__(self, detail: str, *, source: str, line: int | None = None,
                 unit: str = "line") -> None:
        super().__init__(f"{where(source, line, unit)}: {detail}")
        self.source = source
        self.line = line


@dataclass(frozen=True, slots=True)
class InputOptions:
    """How to read the input: the settings ``mlxpa run``, ``mlxpa plan`` and ``read_rows`` share.

    Attributes:
        fmt: ``jsonl``, ``parquet``, ``csv``, ``hf``, or None (by extension).
        prompt_column: Field of the text prompt.
        messages_column: Field of the chat messages.
        id_column: Field of the row id.
        system: A system message put before every row's prompt.
        keep_columns: Input fields copied to every output record (``Row.keep``).
        split_special_tokens: Tokenize control-token text in a ``prompt`` as ordinary text
            (chat ``messages`` always are); see :mod:`mlxpa.inputs.encode`.
        questions: The question set asked of every row without a ``questions`` field of its
            own (``--questions FILE``; :mod:`mlxpa.annotation`), or None.
        gold_column: The field of a row's gold labels (``--gold-column``), or None.
        permute_labels: Score each question that lists its labels also with them listed in
            a second order (``--permute-labels``, the label order check).
        chat_template: A chat template for chat rows instead of the model's
            (``--chat-template``), or None.

    Raises:
        ValueError: An unknown format, or a kept column named like an output field.
    """

    fmt: str | None = None
    prompt_column: str = "prompt"
    messages_column: str = "messages"
    id_column: str = "id"
    system: str | None = None
    keep_columns: tuple[str, ...] = ()
    split_special_tokens: bool = False
    questions: QuestionSet | None = None
    gold_column: str | None = None
    permute_labels: bool = False
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if self.fmt is not None:
            check_format(self.fmt)
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        clash = set(self.keep_columns) & OUTPUT_FIELDS
        if clash:
            raise ValueError(f"keep columns {', '.join(sorted(clash))}: an output field has "
                             "that name")

    @property
    def request_spec(self) -> RequestSpec:
        """How the input's rows spell a request (:mod:`mlxpa.inputs.schema`)."""
        return _request_spec(self)

    def known(self) -> frozenset[str]:
        """Fields with a meaning for mlxpa (everything else passes through)."""
        return known_fields(self.request_spec)


@functools.lru_cache(maxsize=64)
def _request_spec(o: InputOptions) -> RequestSpec:
    return RequestSpec(o.prompt_column, o.messages_column, o.id_column, o.system, o.questions,
                       o.gold_column, o.keep_columns)


class RowSpec(NamedTuple):
    """How to read the rows of one source.

    Attributes:
        source: Display name of the source (a path or ``"<stdin>"``).
        unit: ``"line"`` (JSONL, CSV) or ``"row"`` (Parquet, ``datasets``).
        options: The reader settings.
    """

    source: str
    unit: str = "line"
    options: InputOptions = InputOptions()


def check_format(fmt: str) -> str:
    """``fmt``, when it is one of :data:`FORMATS`.

    Raises:
        ValueError: It is not.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return fmt


def check_columns(names: list[str], spec: RowSpec) -> list[str]:
    """The columns of ``names`` the reader uses (a column no row can use is not read).

    Raises:
        InputError: There is no prompt or messages column (nor an OpenAI ``body``).
    """
    o = spec.options
    if (o.prompt_column not in names and o.messages_column not in names
            and "prompt_token_ids" not in names and not ("custom_id" in names
                                                          and "body" in names)):
        raise InputError(f'no column "{o.prompt_column}" or "{o.messages_column}" '
                         f"(columns: {', '.join(names)}); add a header line naming the "
                         "prompt column, or pass --prompt-column NAME", source=spec.source)
    if "questions" in names:  # a row's own questions may name any column as gold
        return list(names)
    return [n for n in names if is_relevant(n, o)]


def is_relevant(key: str, options: InputOptions) -> bool:
    """Whether field ``key`` can matter for a row (read it from a columnar file)."""
    return (key in options.known() or key in options.keep_columns
            or key in ("custom_id", "method", "url", "body") or sampling_like(key))


def where(source: str, line: int | None, unit: str) -> str:
    """``source``, or ``source line N`` / ``source row N``."""
    return source if line is None else f"{source} {unit} {line}"


def plural(n: int, word: str) -> str:
    """``"1 prompt"``, ``"2 prompts"``: ``n`` and ``word``, with an ``s`` unless ``n`` is 1."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
