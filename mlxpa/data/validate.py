"""The validation pass: read the whole input once, before any model work, in constant memory.

It keeps only each id's first line (for duplicate ids) and the first :data:`MAX_PROBLEMS`
problems, so a bad row far down a large file stops the run before the model loads, with every
problem named by file, line (or row) and field. It also decides which rows an earlier run
already wrote (``--resume``) and whether the input is an OpenAI Batch file.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from mlxpa.data.reader_options import InputError, where
from mlxpa.data.resume import Existing, id_key
from mlxpa.data.rows import Row
from mlxpa.inputs.processor import InputProcessor, token_id_problems
from mlxpa.sampling_params import SamplingParams

MAX_PROBLEMS = 20


@dataclass(slots=True)
class Validation:
    """What the validation pass found.

    Attributes:
        num_rows: Rows in the input.
        problems: The first ``MAX_PROBLEMS`` problems, each with file, line and field.
        num_problems: All problems (invalid rows and duplicate ids) of rows not yet done.
        row_problems: Row index to message, for rows that are invalid beyond their own
            fields: an id an earlier row already has, or sampling fields that conflict with
            the run's defaults (``min_tokens`` above ``max_tokens``).
        done: Id key to input index of each row the output already holds in full
            (``--resume``; the index places its records when the output is put in order).
        num_done: Rows skipped because the output already holds them.
        cut_at: JSONL byte offset to cut a row whose samples were partly written, or None.
        all_openai: Every row that is not invalid is an OpenAI Batch API line (at least one is).
        constrained: Some row that will run is decoded under a grammar (its own constraint
            or the defaults'; a ``choice`` row is scored and needs none).
    """

    num_rows: int = 0
    problems: list[str] = field(default_factory=list)
    num_problems: int = 0
    row_problems: dict[int, str] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    num_done: int = 0
    cut_at: int | None = None
    all_openai: bool = False
    constrained: bool = False

    def report(self, what: str = "nothing was run (--skip-invalid runs the rest and writes "
               "an error row for each)") -> str:
        """The problems, listed after ``what`` (what the command does about them)."""
        shown = "\n".join(f"  {p}" for p in self.problems)
        more = self.num_problems - len(self.problems)
        tail = f"\n  ... and {more} more" if more > 0 else ""
        return f"{self.num_problems} invalid row(s) of {self.num_rows}; {what}:\n{shown}{tail}"


def _duplicate(row: Row, source: str, unit: str, first: int | None) -> str:
    """The problem of a row whose id an earlier row (at ``first``) has."""
    default = (" (a row without an id field has its index as id)"
               if isinstance(row.id, int) and row.id == row.index else "")
    return (f"{where(source, row.line, unit)}: duplicate id {json.dumps(row.id)}{default} "
            f"(first at {unit} {first})")


def validate(rows: Iterable[Row], *, source: str, unit: str,
             existing: Existing | None = None, default_n: int = 1,
             defaults: SamplingParams | None = None,
             vocab_size: int | None = None,
             check_prompt: Callable[[Row], str | None] | None = None) -> Validation:
    """Read every row once; collect problems, duplicate ids and rows already done.

    Args:
        rows: The input rows (read lazily).
        source: The input's display name.
        unit: ``"line"`` or ``"row"``.
        existing: What the output already holds (``--resume``), or None.
        default_n: Samples per row for rows that do not set ``n``.
        defaults: The run's sampling defaults: each row's fields are checked merged with
            them (None: not checked).
        vocab_size: The model's vocabulary size: every token id a row (or the defaults)
            gives must be below it (None: not checked here; the engine refuses them).
        check_prompt: A row's prompt problem found by the tokenizer (a chat template that
            rejects its messages), or None.

    Returns:
        The :class:`Validation`.
    Raises:
        InputError: The input as a whole cannot be read.
        ValueError: A default token id (``--stop-token-id``) outside the vocabulary.
    """
    _check_default_ids(defaults, vocab_size)
    checker = InputProcessor(None, vocab_size)
    v = Validation()
    first_line: dict[str, int | None] = {}
    openai, any_openai = True, False
    for row in _watch_kept(rows, source):
        v.num_rows += 1
        # An invalid line does not change the output format of an OpenAI Batch file.
        openai = openai and (row.openai is not None or row.error is not None)
        any_openai = any_openai or row.openai is not None
        if row.id is None:  # an undecodable record: a problem, never a duplicate or done
            _add_problem(v, row.error)
            continue
        key = id_key(row.id)
        # A duplicate is never done: the output's rows for this id are the first row's.
        if (key not in first_line and existing is not None
                and _is_done(row, key, existing, default_n, v)):
            v.done[key] = row.index
            v.num_done += 1
            first_line[key] = row.line
            continue
        problem = (row.error or run_problem(row, defaults, checker)
                   or (check_prompt(row) if check_prompt is not None else None))
        if problem is not None and row.error is None:
            problem = f"{where(source, row.line, unit)}: {problem}"
            v.row_problems[row.index] = problem
        if key in first_line:
            problem = v.row_problems[row.index] = _duplicate(row, source, unit,
                                                            first_line[key])
        else:
            first_line[key] = row.line
        _record(v, row, problem, defaults)
    v.all_openai = openai and any_openai
    return v


def _record(v: Validation, row: Row, problem: str | None,
            defaults: SamplingParams | None) -> None:
    """Count the row's problem, or note its constraint (its own or the defaults') when it
    will run."""
    if problem is not None:
        _add_problem(v, problem)
    elif getattr(row.params.get("structured_outputs",
                                getattr(defaults, "structured_outputs", None)),
                 "decoded", False):  # a choice is scored: no grammar
        v.constrained = True


def _check_default_ids(defaults: SamplingParams | None, vocab_size: int | None) -> None:
    """Raise ``ValueError`` naming ``--stop-token-id`` for a default id outside the vocabulary
    (once, not on every row that does not set its own)."""
    if vocab_size is not None and defaults is not None:
        for problem in token_id_problems({"stop_token_ids": defaults.stop_token_ids,
                                          "logit_bias": defaults.logit_bias}, vocab_size):
            raise ValueError(problem.replace('field "stop_token_ids"', "--stop-token-id"))


def _watch_kept(rows: Iterable[Row], source: str) -> Iterator[Row]:
    """``rows``, then a warning naming each ``--keep-columns`` field no row had a value for
    (a typo there would otherwise add a column of nulls silently)."""
    kept: set[str] = set()
    columns: Iterable[str] = ()
    for row in rows:
        if row.keep:
            kept.update(c for c, value in row.keep.items() if value is not None)
            columns = row.keep.keys()
        yield row
    missing = [c for c in columns if c not in kept]
    if missing:
        warnings.warn(f"--keep-columns: no row of {source} has a value for "
                      f"{', '.join(missing)} (its output column is null)", stacklevel=2)


def run_problem(row: Row, defaults: SamplingParams | None,
                checker: InputProcessor) -> str | None:
    """What stops a well-formed row from running with the run's defaults and model: token ids
    (its prompt's too) outside the vocabulary, fields that conflict once merged (``min_tokens``
    above ``max_tokens``), as the input processor finds them
    (:meth:`~mlxpa.inputs.InputProcessor.sampling_params`); None when nothing does."""
    try:
        checker.sampling_params(row.as_request(), defaults)
    except ValueError as e:
        return str(e)
    return None


def _add_problem(v: Validation, problem: str) -> None:
    v.num_problems += 1
    if len(v.problems) < MAX_PROBLEMS:
        v.problems.append(problem)


def _is_done(row: Row, key: str, existing: Existing, default_n: int, v: Validation) -> bool:
    count = existing.counts.get(key, 0)
    if count == 0:
        return False
    need = (1 if existing.fmt == "openai" or row.questions is not None
            else row.params.get("n", default_n))
    if count >= need:
        return True
    tail = existing.tail
    if tail is not None and tail.key == key and tail.count == count:
        v.cut_at = tail.offset  # its samples were cut short by a crash: run it again
    return False


def check(v: Validation, source: str, what: str | None = None) -> None:
    """Raise when the validation found problems (``what``: what the command does about them,
    for :meth:`Validation.report`; None: ``run``'s words).

    Raises:
        InputError: Listing the first problems (:meth:`Validation.report`).
    """
    if v.num_problems:
        raise InputError(v.report() if what is None else v.report(what), source=source)
