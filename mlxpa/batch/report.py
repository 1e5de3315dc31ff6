"""The end of a batch run, local or on Ray: the final report on the console, the failed-rows
warning, ``--metrics-json``; and the model name that result records carry."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from rich.console import Console

from mlxpa.batch.options import RunOptions
from mlxpa.engine.metrics import Stats
from mlxpa.engine.progress import summary_table

if TYPE_CHECKING:
    from mlxpa.annotation.tally import AnswerTally


def final_report(stats: Stats, console: Console, options: RunOptions, *,
                 table: bool = True, kv_blocks: tuple[int, int] | None = None,
                 note: str | None = None, metrics: dict | None = None,
                 answers: AnswerTally | None = None) -> None:
    """Report a finished run (with ``options.show_progress``) and write ``--metrics-json``.

    Args:
        stats: The run's statistics.
        console: Where the report goes (stderr).
        options: ``show_progress`` and ``metrics_json`` apply.
        table: Print the summary table (False: nothing ran).
        kv_blocks: The pool's usable blocks and the budget's, for the table (None: not one
            pool).
        note: A line printed after the table (the Ray replicas').
        metrics: What ``--metrics-json`` holds (None: ``stats.to_dict()``).
        answers: The answers of rows asked questions: their figures against gold labels and
            the label order check, printed after the table and under ``"annotation"`` in
            ``--metrics-json`` (None, or no such row: none).
    """
    if options.show_progress and table:
        console.print(summary_table(stats, *(kv_blocks or ())))
        if note:
            console.print(note, markup=False, highlight=False)
    figures = answers.figures() if answers is not None and answers.rows else None
    if options.show_progress and figures is not None:
        for t in answers.tables(calibrated=options.calibration is not None):
            console.print(t)
    if (options.show_progress and figures is not None and not figures["questions"]
            and answers.gold_column):
        console.print(f'warning: no row has a gold label in the field "{answers.gold_column}" '
                      "(--gold-column): no quality figures", style="yellow", highlight=False,
                      soft_wrap=True)
    if figures is not None:
        metrics = {**(stats.to_dict() if metrics is None else metrics), "annotation": figures}
    if options.show_progress and stats.failed_rows:
        console.print(f"warning: {stats.failed_rows} row(s) failed; their output rows "
                      "carry an error field", style="yellow", highlight=False, soft_wrap=True)
    if options.metrics_json:
        with open(options.metrics_json, "w") as f:
            json.dump(stats.to_dict() if metrics is None else metrics, f, indent=2)


def model_name(spec: str | None) -> str:
    """The model's name in result records (OpenAI Batch lines): the ``--model`` folder's or
    file's base name, or the default model's."""
    from mlxpa.loader.models import DEFAULT_MODEL_NAME

    return os.path.basename(os.path.normpath(spec)) if spec else DEFAULT_MODEL_NAME
