"""The constraint type, the row fields and the labels' join of ``mlxpa.structured`` are pure
Python: importing them (and the package, which ``mlxpa.config`` imports through the spec) in a
fresh interpreter loads no mlx; the matchers and the mask, which the runner uses, are the
package's only mlx."""

from __future__ import annotations

from tests.core.test_no_mlx import loaded_mlx

NO_MLX = ["mlxpa.structured", "mlxpa.structured.spec", "mlxpa.structured.fields",
          "mlxpa.structured.labels", "mlxpa.config"]


def test_spec_and_fields_import_no_mlx():
    assert loaded_mlx(NO_MLX) == ""


def test_the_check_would_see_mlx():
    """The probe is not vacuous: the mask module does load mlx."""
    assert "mlx.core" in loaded_mlx(["mlxpa.structured.mask"]).split(",")
