"""``resolve_model``'s message for a model path that does not exist."""

from __future__ import annotations

import pytest

from mlxpa.loader.models import resolve_model


def test_missing_model_path_says_it_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder or file"):
        resolve_model(str(tmp_path / "no" / "such"))

