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


def test_bench_file_workload_needs_input_before_the_model_loads(tokenizer_only):
    r = cli("bench", "--model", tokenizer_only, "--workload", "file")
    assert r.exit_code == 1, r.output
    assert "--workload file needs --input PATH" in r.stderr


def test_bench_file_workload_validates_rows_like_run(tmp_path, tiny, tokenizer_only):
    """Invalid rows named by file and line and counted (before the model loads); each row's
    own max_tokens is the output length it is timed with (the oracle: the JSON's token
    count, 5 + 3 with --output-len 3)."""
    src = write_jsonl(tmp_path / "rows.jsonl", [
        {"id": "a", "prompt": "hello", "max_tokens": 5}, ROBOT, {"prompt": "x", "tmperature": 1},
        {"id": "b", "prompt": "world"}])
    r = cli("bench", "--model", tokenizer_only, "--workload", "file", "--input", src)
    assert r.exit_code == 1, r.output  # the rows are read, then the model load fails
    assert "warning: skipped 2 invalid row(s) of " + src in r.stderr
    assert f'{src} line 2: field "messages": the chat template rejected them' in r.stderr
    assert f'{src} line 3: field "tmperature"' in r.stderr
    assert "file: 2 prompts, " in r.stderr
    out = tmp_path / "f.json"
    r = cli("bench", "--model", tiny, "--workload", "file", "--input", src, "--output-len", 3,
            "--baselines", "mlxpa", "--json", out, "--kv-memory", "0.01", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["workload"]["output_tokens"] == 8


def test_bench_file_workload_with_no_valid_row_names_them(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "rows.jsonl", [ROBOT])
    r = cli("bench", "--model", tokenizer_only, "--workload", "file", "--input", src)
    assert r.exit_code == 2, r.output
    assert f"{src}: 1 invalid row(s) of 1; nothing to time:" in r.stderr


def plan_json(src, model, *more):
    r = cli("plan", src, "--model", model, "--json", *more)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), r.stderr


def test_plan_counts_n_samples_per_row(tmp_path, tokenizer_only):
    """40 byte tokens + 20 outputs = 4 blocks of 16 per sample, 4 samples: 16 blocks without
    sharing; with sharing the 2 full prompt blocks are held once: 2 + 4 * 2 = 10."""
    src = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "x" * 40, "n": 4, "max_tokens": 20}])
    p, _ = plan_json(src, tokenizer_only)
    assert (p["kv_blocks_without_sharing"], p["kv_blocks_with_sharing"]) == (16, 10)


def test_plan_clamps_max_tokens_and_names_rows_over_the_context(tmp_path, tokenizer_only):
    """The tiny model's context is 4096 tokens: "hello" (5 tokens) with max_tokens 1e11 holds
    4096 tokens = 256 blocks, as run clamps it; a 5000-token prompt is named, not planned."""
    src = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "hello", "max_tokens": 10**11},
                                             {"id": "long", "prompt": "y" * 5000}])
    p, err = plan_json(src, tokenizer_only)
    assert p["kv_blocks_without_sharing"] == 256
    assert (p["rows"], p["over_context_rows"]) == (1, 1)
    assert p["over_context"] == [f"{src} line 2: prompt has 5000 tokens; the limit is 4095 "
                                 "(the context holds 4096 tokens)"]
    assert "warning: 1 row(s) over the context" in err
    p, _ = plan_json(src, tokenizer_only, "--max-model-len", 100)
    assert p["kv_blocks_without_sharing"] == 7  # ceil(100 / 16)


def test_plan_lists_invalid_rows_and_exits_2(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "hello"}, ROBOT])
    r = cli("plan", src, "--model", tokenizer_only)
    assert r.exit_code == 2, r.output
    assert f"{src}: 1 invalid row(s) of 2; nothing was planned (--skip-invalid plans " in r.stderr
    assert f'{src} line 2: field "messages": the chat template rejected them' in r.stderr
    assert "error row" not in r.stderr
    p, _ = plan_json(src, tokenizer_only, "--skip-invalid")
    assert (p["rows"], p["invalid_rows"]) == (1, 1)
