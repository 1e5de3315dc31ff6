"""Typed questions over a document: :class:`Question`, :class:`QuestionSet`, and their parsing.

A question is named and typed: ``choice`` (labels), ``yes_no`` (two labels, ``yes`` first)
or ``scale`` (ordered labels with numeric values). Its ``template`` says how it follows the
document (the text after the document, up to where a label is scored); ``{question}`` and
``{labels}`` in it are filled in. A question set adds an optional ``preamble`` (instructions,
few-shot examples) put before every document. The same objects are read from a
``--questions`` file and from a row's ``questions`` field; every problem is collected and
names the field (``field "questions[1].labels" must be ...``), as a row's other fields are.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import string
from dataclasses import dataclass
from typing import Any

from mlxpa.messages import field_error_text, quote_value
from mlxpa.utils import read_json

QUESTION_TYPES = ("choice", "yes_no", "scale")
# How a question follows the document when it gives no template: a blank line, the question
# and "Answer: " (the label is scored right after it; the tokenizer's join gives the trailing
# space to the label, see mlxpa.structured.labels). A scale lists its labels (their range is
# part of the question); a choice or yes/no question does not: a small model tends to copy the
# first label listed (docs/annotation.md), and a template with {labels} lists them.
DEFAULT_TEMPLATES = {
    "choice": "\n\nQuestion: {question}\nAnswer: ",
    "yes_no": "\n\nQuestion: {question}\nAnswer: ",
    "scale": "\n\nQuestion: {question}\nScale: {labels}\nAnswer: ",
}
YES_NO_LABELS = ("yes", "no")
PLACEHOLDERS = ("question", "labels")
QUESTION_KEYS = ("name", "type", "question", "labels", "values", "range", "template",
                 "gold_field")
SET_KEYS = ("version", "preamble", "questions")
MAX_SCALE_LABELS = 101
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class Question:
    """One typed question.

    Attributes:
        name: Its key in a row's ``answers`` (letters, digits, ``_``, ``.``, ``-``).
        type: One of :data:`QUESTION_TYPES`.
        labels: The answers it can take, in order (a ``scale``'s from low to high; a
            ``yes_no``'s affirmative first). Each is scored verbatim after the suffix.
        question: The question's words (``{question}`` of the template).
        template: How it follows the document; None: :data:`DEFAULT_TEMPLATES` of its type.
        gold_field: The row field holding its gold label, or None.
        values: A ``scale``'s value of each label (strictly increasing), else None.
        listing: The order ``{labels}`` lists the labels in (indices into :attr:`labels`),
            or None: their own order. Answers keep :attr:`labels`' order whatever it is.
    """

    name: str
    type: str
    labels: tuple[str, ...]
    question: str = ""
    template: str | None = None
    gold_field: str | None = None
    values: tuple[float, ...] | None = None
    listing: tuple[int, ...] | None = None

    @property
    def suffix(self) -> str:
        """The text put after the document: the template with its placeholders filled."""
        template = DEFAULT_TEMPLATES[self.type] if self.template is None else self.template
        order = range(len(self.labels)) if self.listing is None else self.listing
        return template.format(question=self.question,
                               labels=", ".join(self.labels[i] for i in order))

    def relisted(self) -> Question:
        """The question with its labels listed in a second order, the reverse (the label
        order check: a model that prefers a position answers differently). Its
        :attr:`labels`, and so its answers' order, are unchanged."""
        order = range(len(self.labels)) if self.listing is None else self.listing
        return dataclasses.replace(self, listing=tuple(reversed(order)))

    def index(self, label: str) -> int:
        """The position of ``label`` in :attr:`labels` (ValueError when it is not one)."""
        return self.labels.index(label)


@dataclass(frozen=True, slots=True)
class QuestionSet:
    """The questions asked of every document of a row (or of every row).

    Attributes:
        questions: In the order given (names distinct).
        preamble: Text put before each document, with a blank line (a prompt) or as a system
            message (messages); None: none.
    """

    questions: tuple[Question, ...]
    preamble: str | None = None

    def __getitem__(self, name: str) -> Question:
        return next(q for q in self.questions if q.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.questions)


def parse_question_set(value: Any, field: str, problems: list[str]) -> QuestionSet | None:
    """A question set from a JSON value: a list of question objects, or an object with
    ``questions`` and optional ``preamble`` (text) and ``version`` (1). Each problem is
    appended to ``problems`` naming ``field`` and the part (``questions[0].type``)."""
    listed_at = None
    if isinstance(value, list):  # its questions are named field[i]
        value, listed_at = {"questions": value}, field or "questions"
    if not isinstance(value, dict):
        wanted = 'a list of questions or an object with "questions"'
        problems.append(field_error_text(field, wanted, value) if field
                        else f"the question set must be {wanted}, got {quote_value(value)}")
        return None
    before = len(problems)
    _unknown_keys(value, SET_KEYS, field, problems)
    if value.get("version", 1) != 1:
        problems.append(field_error_text(_at(field, "version"), "1", value["version"]))
    preamble = value.get("preamble")
    if preamble is not None and not isinstance(preamble, str):
        problems.append(field_error_text(_at(field, "preamble"), "a string", preamble))
    listed = value.get("questions")
    where = _at(field, "questions") if listed_at is None else listed_at
    if not isinstance(listed, list) or not listed:
        problems.append(field_error_text(where, "a non-empty list of question objects", listed))
        return None
    questions = [parse_question(q, f"{where}[{i}]", problems) for i, q in enumerate(listed)]
    names = [q.name for q in questions if q is not None]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        problems.append(f'field "{where}": question name {quote_value(twice)} is given twice')
    if len(problems) > before:
        return None
    return QuestionSet(tuple(questions), preamble or None)


def parse_question(obj: Any, field: str, problems: list[str]) -> Question | None:
    """One question object (``name``, ``type``, ``question``, ``labels``, ``values``,
    ``range``, ``template``, ``gold_field``); None with its problems appended."""
    if not isinstance(obj, dict):
        problems.append(field_error_text(field, 'an object with "name" and "type"', obj))
        return None
    before = len(problems)
    _unknown_keys(obj, QUESTION_KEYS, field, problems)
    name, kind = obj.get("name"), obj.get("type")
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        problems.append(field_error_text(f"{field}.name",
                                         "a name of letters, digits, _, . or -", name))
    if kind not in QUESTION_TYPES:
        problems.append(field_error_text(f"{field}.type",
                                         " or ".join(map(quote_value, QUESTION_TYPES)), kind))
        return None
    text = obj.get("question", "")
    if not isinstance(text, str):
        problems.append(field_error_text(f"{field}.question", "a string", text))
    labels, values = _labels(obj, kind, field, problems)
    template = _template(obj.get("template"), f"{field}.template", problems)
    used = _placeholders(DEFAULT_TEMPLATES[kind] if template is None else template)
    if "question" in used and isinstance(text, str) and not text.strip():
        problems.append(f'field "{field}.question" is missing (the template asks it)')
    gold = obj.get("gold_field")
    if gold is not None and not (isinstance(gold, str) and gold):
        problems.append(field_error_text(f"{field}.gold_field", "a field name", gold))
    if len(problems) > before:
        return None
    return Question(name, kind, labels, text, template, gold, values)


def _unknown_keys(obj: dict, known: tuple[str, ...], field: str, problems: list[str]) -> None:
    for key in obj:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, 1, 0.7)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            problems.append(f'field "{_at(field, str(key))}" is unknown{hint}; the fields '
                            f"are {', '.join(known)}")


def _at(field: str, key: str) -> str:
    """``field.key``, or ``key`` at the top level (``field`` empty)."""
    return f"{field}.{key}" if field else key


def _labels(obj: dict, kind: str, field: str,
            problems: list[str]) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """The question's labels and (``scale``) values, by its type's rules."""
    labels, span = obj.get("labels"), obj.get("range")
    if span is not None and kind != "scale":
        problems.append(f'field "{field}.range" is for a "scale" question')
    if obj.get("values") is not None and kind != "scale":
        problems.append(f'field "{field}.values" is for a "scale" question')
    if kind == "yes_no" and labels is None:
        return YES_NO_LABELS, None
    if kind == "scale" and span is not None:
        if labels is not None:
            problems.append(f'give field "{field}.labels" or field "{field}.range", not both')
            return (), None
        return _range(span, f"{field}.range", problems)
    if kind == "scale" and isinstance(labels, list):  # numbers as their text
        labels = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                  for v in labels]
    count = "exactly 2" if kind == "yes_no" else "2 or more"
    if not (isinstance(labels, list) and all(isinstance(c, str) and c for c in labels)
            and len(labels) >= 2 and (kind != "yes_no" or len(labels) == 2)
            and len(set(labels)) == len(labels)):
        problems.append(field_error_text(f"{field}.labels",
                                         f"a list of {count} distinct non-empty strings",
                                         obj.get("labels")))
        return (), None
    if kind != "scale":
        return tuple(labels), None
    return tuple(labels), _values(obj.get("values"), labels, f"{field}.values", problems)


def _range(span: Any, field: str,
           problems: list[str]) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
    """``[low, high]`` integers: labels ``"low"`` .. ``"high"``, valued as themselves."""
    ok = (isinstance(span, list) and len(span) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
          and span[0] < span[1] and span[1] - span[0] < MAX_SCALE_LABELS)
    if not ok:
        problems.append(field_error_text(field, f"[low, high], integers, low < high, at most "
                                   f"{MAX_SCALE_LABELS} values", span))
        return (), None
    values = range(span[0], span[1] + 1)
    return tuple(str(v) for v in values), tuple(float(v) for v in values)


def _values(given: Any, labels: list[str], field: str,
            problems: list[str]) -> tuple[float, ...] | None:
    """A scale's values: as given, else its labels read as numbers when they all are
    (increasing), else 1, 2, ... in label order."""
    if given is None:
        try:
            read = [float(c) for c in labels]
        except ValueError:
            read = []
        ok = read and all(math.isfinite(v) for v in read) and _increasing(read)
        return tuple(read) if ok else tuple(float(i + 1) for i in range(len(labels)))
    if not (isinstance(given, list) and len(given) == len(labels)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) for v in given) and _increasing(given)):
        problems.append(field_error_text(
            field, f"{len(labels)} strictly increasing numbers, one per label", given))
        return None
    return tuple(float(v) for v in given)


def _increasing(values: list[float]) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


def _template(template: Any, field: str, problems: list[str]) -> str | None:
    """A template with only ``{question}`` and ``{labels}`` in it (``{{``/``}}``: a brace)."""
    if template is None:
        return None
    if not isinstance(template, str):
        problems.append(field_error_text(field, "a string", template))
        return None
    try:
        names = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template)
                 if name is not None]
    except ValueError as e:
        problems.append(f'field "{field}": {e} (write a brace as {{{{ or }}}})')
        return None
    for name, spec, conv in names:
        if name not in PLACEHOLDERS or spec or conv:
            problems.append(f'field "{field}": unknown placeholder {{{name}}} (the template '
                            "may use {question} and {labels}; write a brace as {{ or }})")
            return None
    return template


def _placeholders(template: str) -> set[str]:
    """The placeholder names of a valid template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def load_questions(path: str) -> QuestionSet:
    """The question set of a ``--questions`` JSON file.

    Raises:
        ValueError: The file cannot be read, is not JSON, or is not a question set (the
            message names the file and every field at fault).
    """
    value = read_json(path)
    problems: list[str] = []
    questions = parse_question_set(value, "", problems)
    if questions is None:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    return questions
