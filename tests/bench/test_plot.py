"""``mlxpa bench --plot``: a missing matplotlib is reported before any work, and the plot is
written (speed-ups computed from the figures given)."""

from __future__ import annotations

import importlib.util

from typer.testing import CliRunner

from mlxpa.bench.report import write_plot
from mlxpa.bench.systems import SystemResult
from mlxpa.cli import app


def test_plot_without_matplotlib_fails_before_loading(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    # A model path that does not exist: had the check come after loading, the error would
    # name the model, not matplotlib.
    r = CliRunner().invoke(app, ["bench", "--plot", str(tmp_path / "p.png"),
                                 "--model", str(tmp_path / "missing")])
    assert r.exit_code == 1
    assert "pip install 'mlxpa[bench]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.png").exists()


def test_plot_is_a_png(tmp_path):
    figures = {"mlxpa": {"total_tokens_per_s": 600.0, "output_tokens_per_s": 30.0},
               "mlx-lm": {"total_tokens_per_s": 150.0, "output_tokens_per_s": 7.5}}
    last = {"mlxpa": SystemResult(1.0, 10, 10, 1, 0, kv_blocks_over_time=[(0.5, 3), (1, 4)])}
    path = tmp_path / "p.png"
    write_plot(str(path), figures, last, "test workload")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
