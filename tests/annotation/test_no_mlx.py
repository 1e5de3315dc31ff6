"""The annotation package is pure Python: importing every module of it in a fresh interpreter
loads no mlx (it runs where the engine does not, e.g. to fit a calibration)."""

from __future__ import annotations

import pkgutil

import mlxpa.annotation
from tests.core.test_no_mlx import loaded_mlx

MODULES = sorted(f"mlxpa.annotation.{m.name}"
                 for m in pkgutil.iter_modules(mlxpa.annotation.__path__))


def test_every_module_listed():
    assert {"mlxpa.annotation.questions", "mlxpa.annotation.metrics",
            "mlxpa.annotation.calibration", "mlxpa.annotation.report"} <= set(MODULES)


def test_annotation_imports_no_mlx():
    assert loaded_mlx(["mlxpa.annotation", *MODULES]) == ""
