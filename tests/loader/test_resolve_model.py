"""``resolve_model``'s message for a model path that does not exist."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.loader.models import resolve_model


def test_missing_model_path_says_it_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder or file"):
        resolve_model(str(tmp_path / "no" / "such"))



@pytest.fixture
def folder_copy(tmp_path):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path / "m")


@pytest.mark.parametrize("content", [b"", b"version https://git-lfs.github.com/spec/v1\n"],
                         ids=["empty", "lfs-pointer"])
def test_unreadable_weights_name_the_folder(folder_copy, tmp_path, content):
    """A model.safetensors that is not one (a download or copy cut short, a Git LFS pointer)
    is a load error naming the folder (it was mx.load's RuntimeError with a traceback); the
    CLI prints one line, exit 1."""
    from typer.testing import CliRunner

    from mlxpa.cli import app
    from mlxpa.loader.models import load_model

    (tmp_path / "m" / "model.safetensors").write_bytes(content)
    with pytest.raises(ValueError, match=f"{folder_copy}: the model weights cannot be read"):
        load_model(EngineConfig(model=folder_copy))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(app, ["run", str(rows), "-o", str(tmp_path / "out.jsonl"),
                                 "--model", folder_copy, "-q"])
    assert r.exit_code == 1, r.output
    assert f"error: {folder_copy}: the model weights cannot be read" in r.output
    assert "Traceback" not in r.output


def test_a_config_that_is_not_json_names_the_file(folder_copy, tmp_path):
    config = tmp_path / "m" / "config.json"
    config.write_text('{"model_type": "llama"')
    from typer.testing import CliRunner

    from mlxpa.cli import app

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    r = CliRunner().invoke(app, ["run", str(rows), "-o", str(tmp_path / "out.jsonl"),
                                 "--model", folder_copy, "-q"])
    assert r.exit_code == 1, r.output
    assert f"error: {config}: not a JSON file (" in r.output
