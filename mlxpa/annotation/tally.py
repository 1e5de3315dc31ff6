"""A run's answers counted as they are written: the quality figures of the questions that
have gold labels, and the label order check.

:class:`AnswerTally` keeps, per question (by name and labels), each golded row's input
index, gold label, raw label log-probabilities and answer ``probs`` (calibrated when the run
is), and per question the rows whose answer changed when its labels were listed in the second
order. :meth:`AnswerTally.figures` is what the metrics JSON holds; :meth:`AnswerTally.tables`
the report's tables; :meth:`AnswerTally.golded` what a calibration is fitted on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from mlxpa.annotation.metrics import quality
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.report import figures_table


@dataclass(slots=True)
class _Column:
    question: Question
    index: list[int] = field(default_factory=list)  # golded rows' input indices
    gold: list[int] = field(default_factory=list)
    probs: list[list[float]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    checked: int = 0  # rows whose labels were also listed in the second order
    changed: int = 0  # of those, rows whose answer changed


class AnswerTally:
    """Figures of a run's answers (see the module docstring).

    Args:
        budget: The error budget of the figures' accepted share.
        gold_column: The run's ``--gold-column`` (the report warns when no row has it).
    """

    def __init__(self, budget: float = 0.05, gold_column: str | None = None) -> None:
        self.budget = budget
        self._columns: dict[tuple[str, tuple[str, ...]], _Column] = {}
        self.rows = 0  # rows with answers
        self.checked_rows = 0  # rows with a question listed in two orders
        self.changed_rows = 0  # rows with an answer that changed
        self.gold_column = gold_column  # the run's --gold-column, for the report

    def add(self, questions: QuestionSet, answers: Mapping[str, Mapping[str, Any]],
            gold: Mapping[str, int] | None, changed: list[str] | None,
            index: int = 0) -> None:
        """Count one row: its questions, its ``answers``, its gold label indices (question
        name to index; None: none), the names of its questions whose answer changed (None:
        not checked) and its input index."""
        self.rows += 1
        checked = False
        for q in questions.questions:
            a = answers.get(q.name)
            if a is None:
                continue
            col = self._columns.setdefault((q.name, q.labels), _Column(q))
            if gold and q.name in gold:
                col.index.append(index)
                col.gold.append(gold[q.name])
                col.probs.append([a["probs"][c] for c in q.labels])
                col.logprobs.append([a["logprobs"][c] for c in q.labels])
            if "permuted_label" in a:
                checked = True
                col.checked += 1
                col.changed += q.name in (changed or ())
        self.checked_rows += checked
        self.changed_rows += bool(changed)

    def golded(self) -> dict[str, tuple[Question, np.ndarray, np.ndarray]]:
        """Per question with golded rows (named as in :meth:`figures`): the question, its
        raw label log-probabilities ``[N, K]`` and gold indices ``[N]``, in input order."""
        names, out = self._names(), {}
        for key, col in self._columns.items():
            if col.gold:
                order = np.argsort(col.index, kind="stable")
                out[names[key]] = (col.question, np.asarray(col.logprobs)[order],
                                   np.asarray(col.gold)[order])
        return out

    def _names(self) -> dict[tuple[str, tuple[str, ...]], str]:
        """Each column's name: the question's, with its labels when another label set
        shares it."""
        names = [n for n, _ in self._columns]
        return {(n, labels): n if names.count(n) == 1 else f"{n} {list(labels)}"
                for n, labels in self._columns}

    def figures(self) -> dict[str, Any]:
        """``{"questions": {name: quality figures}, "label_order": {...}}``: the figures of
        each question with golded rows (:func:`~mlxpa.annotation.metrics.quality`), and,
        when labels were listed in two orders, the rows checked, those whose answer
        changed and their share, also per question."""
        names = self._names()
        out: dict[str, Any] = {"questions": {
            names[key]: quality(col.gold, col.probs, budget=self.budget,
                                ordinal=col.question.type == "scale")
            for key, col in self._columns.items() if col.gold}}
        if self.checked_rows:
            out["label_order"] = {
                "rows": self.checked_rows, "changed_rows": self.changed_rows,
                "changed_share": self.changed_rows / self.checked_rows,
                "questions": {names[key]: {"rows": c.checked, "changed": c.changed,
                                           "changed_share": c.changed / c.checked}
                              for key, c in self._columns.items() if c.checked}}
        return out

    def tables(self, calibrated: bool = False) -> list[Table]:
        """The report: a table of figures per golded question, then the label order check."""
        figures = self.figures()
        column = "calibrated" if calibrated else "raw"
        tables = [figures_table(f"{name}: answers against gold labels", {column: f})
                  for name, f in figures["questions"].items()]
        order = figures.get("label_order")
        if order:
            table = Table(title="label order: answers that change with the labels listed "
                          "in the second order", title_justify="left")
            for name in ("question", "rows", "changed", "share"):
                table.add_column(name, justify="left" if name == "question" else "right")
            for name, q in order["questions"].items():
                table.add_row(name, f"{q['rows']:,}", f"{q['changed']:,}",
                              f"{q['changed_share']:.1%}")
            table.add_row("any (rows)", f"{order['rows']:,}", f"{order['changed_rows']:,}",
                          f"{order['changed_share']:.1%}")
            tables.append(table)
        return tables
