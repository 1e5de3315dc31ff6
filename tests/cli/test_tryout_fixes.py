"""Fixes from a new user's tryout: checks before any work (output paths, chat templates,
options), named errors, ``plan`` figures, ``bench --workload file`` rows, broken pipes."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import mlxpa
from mlxpa.cli import app
from tests.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(mlxpa.__file__)))
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
                                 "(the model context (--max-model-len) holds 4096 tokens)"]
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


def test_broken_pipe_says_how_many_rows_were_written_and_exits_141(tmp_path, tiny):
    """``mlxpa run ... | head -1``: the reader goes away after one line; each row carries
    4 KB (--keep-columns), so the pipe's buffer fills and the writer sees the closed pipe."""
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "big.jsonl",
                      [{"prompt": "hi", "pad": "x" * 4096} for _ in range(200)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxpa", "run", src, "--model", tiny, "--max-tokens", "1",
         "--keep-columns", "pad", "--kv-memory", "0.01", "-q", "--blas", "system"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": REPO})
    assert json.loads(proc.stdout.readline())["pad"] == "x" * 4096
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: the output pipe was closed after ")
    assert int(lines[0].split(" after ")[1].split()[0]) >= 1


@pytest.fixture
def captured(monkeypatch):
    """The sampling defaults ``mlxpa run`` builds from its options (nothing runs)."""
    import importlib

    run_cli = importlib.import_module("mlxpa.cli.run")  # the module, not the command
    got = {}
    monkeypatch.setattr(run_cli, "_run_command",
                        lambda *a, **k: got.setdefault("defaults", a[3]))
    return got


def test_stop_interprets_backslash_escapes(captured):
    r = cli("run", "-", "--stop", "\\n", "--stop", "a\\tb\\\\n", "--stop", "C:\\x", input="")
    assert r.exit_code == 0, r.output
    assert captured["defaults"].stop == ("\n", "a\tb\\n", "C:\\x")


def test_choice_labels_are_verbatim_and_checked(captured):
    r = cli("run", "-", "--choice", " positive, negative", input="")
    assert r.exit_code == 0, r.output
    assert captured["defaults"].structured.choices == (" positive", " negative")
    for value, message in (("a,,b", "label 2 is empty"), ("a,b,", "label 3 is empty"),
                           ("pos,pos", "label 'pos' is given twice")):
        r = cli("run", "-", "--choice", value, input="")
        assert r.exit_code == 2 and message in r.stderr, (value, r.output)


def test_options_are_named_as_the_user_wrote_them(tmp_path, tiny):
    src = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "hi"}])
    r = cli("run", src, "--model", tiny, "--stop-token-id", 999999999)
    assert r.exit_code == 1, r.output
    assert "--stop-token-id: token id 999999999 is outside the model's vocabulary" in r.stderr
    assert "stop_token_ids" not in r.stderr and "line 1" not in r.stderr
    r = cli("run", src, "--model", tiny, "--kv-memory", 0)
    assert r.exit_code == 2 and "--kv-memory must be > 0, got 0.0" in r.stderr
    assert "kv_memory_gib" not in r.stderr
    r = cli("run", src, "--model", tiny, "--max-model-len", 1)
    assert r.exit_code == 2 and "--max-model-len must be an integer >= 2" in r.stderr


def test_top_k_message_names_minus_one(tmp_path, tiny):
    src = write_jsonl(tmp_path / "k.jsonl", [{"prompt": "hi", "top_k": -2}])
    r = cli("run", src, "--model", tiny)
    assert r.exit_code == 2
    assert 'field "top_k" must be an integer >= 0 (or -1: off), got -2' in r.stderr


def test_help_reads_whole_at_80_columns():
    def help_of(*cmd):
        r = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        return r.output

    top = help_of()
    assert "..." not in top.split("Commands:")[1]
    assert "run    Generate a completion for every row" in top
    bench = help_of("bench")
    assert "``" not in bench and "mlx-\n" not in bench
    assert "allocated up front" in bench and "the pool takes only" not in bench
    for cmd in ("run", "plan"):
        text = help_of(cmd)
        assert ".tsv, .txt" in text and "--blas [auto|system|bundled]" in text
    assert "Output tokens of a row that does not set max_tokens" in " ".join(
        help_of("plan").split())


def test_model_that_is_a_file_but_not_gguf_is_named(tmp_path):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\0" * 16)
    src = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "hi"}])
    r = cli("run", src, "--model", garbage)
    assert r.exit_code == 1, r.output
    assert f"--model {garbage}: a file, but not a .gguf" in r.stderr
    assert "no such folder or file" not in r.stderr


def test_duplicate_of_a_default_id_says_so(tmp_path, tiny):
    src = write_jsonl(tmp_path / "d.jsonl", [{"id": 1, "prompt": "a"}, {"prompt": "b"}])
    r = cli("run", src, "--model", tiny)
    assert r.exit_code == 2
    assert (f"{src} line 2: duplicate id 1 (a row without an id field has its index as id) "
            "(first at line 1)") in r.stderr


def test_keep_columns_nobody_has_warns(tmp_path, tiny):
    src = write_jsonl(tmp_path / "k.jsonl", [{"prompt": "a", "topic": "x"}])
    with pytest.warns(UserWarning) as caught:  # `mlxpa` prints it as "warning: ..."
        r = cli("run", src, "--model", tiny, "--max-tokens", 1, "--kv-memory", "0.01", "-q",
                "--keep-columns", "topic,nosuch")
    assert r.exit_code == 0, r.output
    assert [str(w.message) for w in caught] == [
        f"--keep-columns: no row of {src} has a value for nosuch (its output column is null)"]


def test_wording_names_the_file_and_the_option(tmp_path):
    arr = tmp_path / "rows.json"
    arr.write_text('[{"prompt": "a"}]')
    r = cli("run", arr, "--model", tmp_path / "none")
    assert r.exit_code == 2
    assert f"jq -c '.[]' {arr} > {tmp_path / 'rows.jsonl'}" in r.stderr
    odd = tmp_path / "rows.xyz"
    odd.write_text("a\n")
    r = cli("run", odd, "--model", tmp_path / "none")
    assert r.exit_code == 2 and "give --input-format jsonl|parquet|csv|txt|hf" in r.stderr
