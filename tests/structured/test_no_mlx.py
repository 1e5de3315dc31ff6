"""The constraint check, the row fields and the labels' join of ``mlxpa.structured`` are pure
Python, as are the configuration, the sampling parameters (the constraint types) and the
messages: importing them in a fresh interpreter loads no mlx; the matchers and the mask, which
the runner uses, are the package's only mlx."""

from __future__ import annotations

from tests.core.test_no_mlx import loaded_mlx

NO_MLX = ["mlxpa.structured", "mlxpa.structured.spec", "mlxpa.structured.fields",
          "mlxpa.structured.labels", "mlxpa.config", "mlxpa.sampling_params", "mlxpa.messages",
          "mlxpa.utils"]


def test_spec_and_fields_import_no_mlx():
    assert loaded_mlx(NO_MLX) == ""


def test_the_check_would_see_mlx():
    """The probe is not vacuous: the mask module does load mlx."""
    assert "mlx.core" in loaded_mlx(["mlxpa.structured.mask"]).split(",")
