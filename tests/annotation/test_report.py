"""The report: tables from figures, the metrics JSON, the reliability diagram (and the error
naming the extra when matplotlib is missing)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from rich.console import Console

from mlxpa.annotation.calibration import Calibration, QuestionCalibration
from mlxpa.annotation.metrics import quality
from mlxpa.annotation.report import (
    calibration_tables,
    figures_table,
    metrics_json,
    reliability_diagram,
)

GOLD = np.array([0, 1, 2, 2])
PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.5, 0.3], [0.05, 0.05, 0.9]])


def _text(table) -> str:
    console = Console(width=120, record=True)
    console.print(table)
    return console.export_text()


def test_a_calibration_table_shows_before_and_after():
    before = quality(GOLD, PROBS, budget=0.0)
    after = quality(GOLD, PROBS ** 2 / (PROBS ** 2).sum(1, keepdims=True), budget=0.0)
    cal = Calibration({"topic": QuestionCalibration(("a", "b", "c"), 0.5, None, 10, 4,
                                                    before, after)})
    (table,) = calibration_tables(cal)
    text = _text(table)
    assert "topic: T = 0.500; fitted on 10 rows, figures on 4 held out" in text
    assert "accuracy" in text and "0.750" in text
    assert f"{before['ece']:.4f}" in text and f"{after['ece']:.4f}" in text
    assert "accepted at 0% errors" in text and "75.0%" in text
    assert "kappa (quadratic)" not in text  # a choice question has none


def test_a_run_table_and_metrics_json():
    figures = quality(GOLD, PROBS, ordinal=True)
    text = _text(figures_table("stars", {"gold": figures}))
    assert "kappa (quadratic)" in text and "macro-F1" in text
    assert metrics_json({"stars": figures}) == {"questions": {"stars": figures}}
    assert "-" in _text(figures_table("x", {"gold": quality(np.zeros(0, int),
                                                             np.zeros((0, 3)))}))


def test_reliability_diagram_is_a_png(tmp_path):
    path = tmp_path / "rel.png"
    before = quality(GOLD, PROBS)
    reliability_diagram(path, {"topic": {"before": before, "after": before},
                               "spam": {"gold": before, "none": None}}, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reliability_diagram_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'mlxpa\[annotation\]'"):
        reliability_diagram(tmp_path / "x.png", {})
