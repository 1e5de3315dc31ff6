"""Model folders shared by the CLI tests (a module that defines a fixture of the same name
uses its own)."""

from __future__ import annotations

import pytest

from tests.tiny_models import STRICT_TEMPLATE, save_tiny_model, save_tokenizer_only


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama folder whose chat template refuses what strict templates refuse."""
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", chat_template=STRICT_TEMPLATE)


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory):
    """A model folder without weights: anything that loads the model fails."""
    return save_tokenizer_only(tmp_path_factory.mktemp("m") / "noweights")
