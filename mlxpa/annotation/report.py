"""The quality report: a rich table per question (before and after calibration), the metrics
JSON, and a reliability diagram saved as PNG.

Everything is drawn from :func:`mlxpa.annotation.metrics.quality` dictionaries (the
``before`` / ``after`` of a calibration file, or the figures of a run with gold labels), so
a calibration file alone redraws its report. matplotlib is imported only to draw the
diagram (``pip install 'mlxpa[annotation]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from mlxpa.annotation.calibration import FEW_ROWS, Calibration, doubt

# (key of the figures, row title, format)
ROWS = (("n", "rows", "{:,}"), ("accuracy", "accuracy", "{:.3f}"),
        ("macro_f1", "macro-F1", "{:.3f}"), ("kappa", "Cohen's kappa", "{:.3f}"),
        ("kappa_quadratic", "kappa (quadratic)", "{:.3f}"), ("log_loss", "log loss", "{:.4f}"),
        ("brier", "Brier (multi-class)", "{:.4f}"), ("ece", "ECE (15 bins)", "{:.4f}"),
        ("mean_confidence", "mean confidence", "{:.3f}"),
        ("accepted_share", "accepted at budget", "{:.1%}"),
        ("threshold", "threshold", "{:.4f}"))


def _cell(figures: Mapping[str, Any] | None, key: str, fmt: str) -> str:
    value = None if figures is None else figures.get(key)
    return "-" if value is None else fmt.format(value)


def figures_table(title: str, columns: Mapping[str, Mapping[str, Any] | None]) -> Table:
    """One question's figures, a column per set of figures (``{"before": ..., "after":
    ...}``, or ``{"gold": ...}`` for a run), a row per figure it has."""
    table = Table(title=title, title_justify="left", min_width=len(title))
    table.add_column("figure")
    for name in columns:
        table.add_column(name, justify="right")
    present = [r for r in ROWS if any(f is not None and r[0] in f for f in columns.values())]
    for key, label, fmt in present:
        if key == "accepted_share":
            budget = next((f["error_budget"] for f in columns.values() if f), None)
            label = f"accepted at {budget:.0%} errors" if budget is not None else label
        table.add_row(label, *(_cell(f, key, fmt) for f in columns.values()))
    return table


def calibration_tables(cal: Calibration) -> list[Table]:
    """A table per calibrated question: the held-out figures before and after, titled with
    the question, its temperature and the split's sizes."""
    tables = []
    for name, q in cal.questions.items():
        bias = ", bias" if q.bias is not None else ""
        title = (f"{name}: T = {q.temperature:.3f}{bias}; fitted on {q.num_fit:,} "
                 f"row{'s' * (q.num_fit != 1)}, figures on {q.num_heldout:,} held out")
        if doubt(q) is not None:
            why = "few rows" if q.num_fit < FEW_ROWS else "T at the end of its range"
            title += (f" (warning: {why}; fit on {FEW_ROWS}+ labelled rows, some of them "
                      "answered wrong)")
        tables.append(figures_table(title, {"before": q.before, "after": q.after}))
    return tables


def metrics_json(figures: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The metrics JSON of a run with gold labels: ``{"questions": {name: figures}}``."""
    return {"questions": {name: dict(f) for name, f in figures.items()}}


def reliability_diagram(path: str | os.PathLike,
                        panels: Mapping[str, Mapping[str, Mapping[str, Any] | None]],
                        title: str | None = None) -> None:
    """Save a reliability diagram as PNG: a panel per question, per set of figures (``before``
    / ``after``) each bin's accuracy against its mean confidence (the figures'
    ``reliability``; a marker's area grows with the bin's rows), the diagonal of perfect
    calibration, and the ECE in the legend.

    Raises:
        ImportError: matplotlib is not installed (the message names the extra).
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the reliability diagram needs matplotlib: "
                          "pip install 'mlxpa[annotation]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (name, columns) in zip(axes[0], panels.items()):
        ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1)
        for (label, figures), marker in zip(columns.items(), "os^D"):
            rel = None if figures is None else figures.get("reliability")
            if not rel:
                continue
            pts = [(c, a, n) for n, c, a in zip(rel["count"], rel["confidence"],
                                                rel["accuracy"]) if n > 0]
            conf, acc, count = zip(*pts)
            line, = ax.plot(conf, acc, linewidth=1, label=f"{label} (ECE {figures['ece']:.3f})")
            ax.scatter(conf, acc, s=[12 + 200 * n / sum(count) for n in count],  # area ~ rows
                       marker=marker, color=line.get_color(), alpha=0.8)
        # a margin past 0 and 1: a bin at confidence or accuracy 1.0 shows whole, not clipped
        ax.set(title=name, xlabel="confidence (top label)", ylabel="accuracy",
               xlim=(-0.03, 1.03), ylim=(-0.03, 1.03), aspect="equal")
        ax.legend(loc="upper left", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
