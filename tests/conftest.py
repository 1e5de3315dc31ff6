"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

# --- default model (Gemma 3 270M) fixtures: tests marked real_model ----------------------------


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted default model folder (converted into the user cache on first use)."""
    from mlxpa.loader.models import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def default_model(default_model_dir):
    """``(model, tokenizer, folder)`` of the default model, float32, loaded once per session."""
    from mlxpa.loader.models import load_model

    return load_model(None)
