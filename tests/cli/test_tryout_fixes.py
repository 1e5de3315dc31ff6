"""Fixes from a new user's tryout: checks before any work (output paths, chat templates,
options), named errors, ``plan`` figures, ``bench --workload file`` rows, broken pipes."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from mlxpa.cli import app
from tests.tiny_models import save_tiny_model

# Raises on any role but user/assistant/system, as real chat templates do.
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", chat_template=STRICT_TEMPLATE)


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory):
    """A model folder without weights: anything that loads the model fails."""
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "noweights",
                             chat_template=STRICT_TEMPLATE)
    os.remove(os.path.join(folder, "model.safetensors"))
    return folder


def cli(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROBOT = {"id": "bad", "messages": [{"role": "robot", "content": "hi"}]}


def test_run_refuses_a_rejected_chat_row_before_the_model_loads(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "ok", "prompt": "hi"}, ROBOT])
    r = cli("run", src, "-o", tmp_path / "out.jsonl", "--model", tokenizer_only, "-q")
    assert r.exit_code == 2, r.output
    assert f"{src} line 2: field \"messages\": the chat template rejected them" in r.stderr
    assert "unknown role robot" in r.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_bench_checks_json_and_plot_paths_before_any_work(tmp_path, tokenizer_only):
    for flag in ("--json", "--plot"):
        target = tmp_path / "missing" / "x.out"
        r = cli("bench", "--model", tokenizer_only, flag, target, "--num-prompts", "1")
        assert r.exit_code == 1, r.output
        assert f"{target}: the output folder {tmp_path / 'missing'} does not exist" in r.stderr
        assert "Traceback" not in r.output
