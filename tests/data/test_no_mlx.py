"""``mlxpa.data`` (rows in and out) and ``import mlxpa`` itself are pure Python: importing them
in a fresh interpreter loads no mlx (ARCHITECTURE.md's never list)."""

from __future__ import annotations

import pkgutil

import mlxpa.data
from tests.core.test_no_mlx import loaded_mlx

DATA_MODULES = sorted(f"mlxpa.data.{m.name}" for m in pkgutil.iter_modules(mlxpa.data.__path__))


def test_data_modules_listed():
    assert {"mlxpa.data.read", "mlxpa.data.write", "mlxpa.data.rows"} <= set(DATA_MODULES)


def test_data_and_the_package_import_no_mlx():
    assert loaded_mlx(["mlxpa", *DATA_MODULES]) == ""
