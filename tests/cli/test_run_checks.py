"""``mlxpa run``'s checks before any work (rows, options, the model path, the output pipe)
and the words of its messages: each names the file, line, field or option the user wrote."""

from __future__ import annotations

import json
import os

import pytest

import mlxpa
from tests.cli.helpers import ROBOT, cli, write_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(mlxpa.__file__)))


def test_run_refuses_a_rejected_chat_row_before_the_model_loads(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "ok", "prompt": "hi"}, ROBOT])
    r = cli("run", src, "-o", tmp_path / "out.jsonl", "--model", tokenizer_only, "-q")
    assert r.exit_code == 2, r.output
    assert f"{src} line 2: field \"messages\": the chat template rejected them" in r.stderr
    assert "unknown role robot" in r.stderr
    assert not (tmp_path / "out.jsonl").exists()



def test_run_refuses_a_prompt_over_the_context_before_the_model_loads(tmp_path,
                                                                   tokenizer_only):
    """A 5,000-token prompt (the tiny model's context is 4,096) gets its error row from the
    tokenizer alone: nothing else to run, so the model (absent here) never loads."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "long", "prompt": "y" * 5000}])
    out = tmp_path / "out.jsonl"
    r = cli("run", src, "-o", out, "--model", tokenizer_only, "-q")
    assert r.exit_code == 0, r.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["error"] == (f"{src} line 1: prompt has 5000 tokens; the limit is 4095 (the "
                            "model context (--max-model-len) holds 4096 tokens)")


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
    assert captured["defaults"].structured_outputs.choices == (" positive", " negative")
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



def test_wording_names_the_file_and_the_option(tmp_path, tokenizer_only):
    arr = tmp_path / "rows.json"
    arr.write_text('[{"prompt": "a"}]')
    r = cli("run", arr, "--model", tokenizer_only)
    assert r.exit_code == 2
    assert f"jq -c '.[]' {arr} > {tmp_path / 'rows.jsonl'}" in r.stderr
    odd = tmp_path / "rows.xyz"
    odd.write_text("a\n")
    r = cli("run", odd, "--model", tokenizer_only)
    assert r.exit_code == 2 and "give --input-format jsonl|parquet|csv|txt|hf" in r.stderr

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("command", ["run", "run --ray", "bench"])
def test_unwritable_outputs_fail_before_any_work(tmp_path, tokenizer_only, command):
    """/dev/full (every write fails) and a regular file in place of the folder: refused at
    once, naming the file, by run, run --ray and bench, for every output they write (the
    model has no weights: had any work started, the error would name the model)."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    (tmp_path / "f").write_text("x")
    name, *more = command.split()
    flags = (["-o", "--metrics-json"] if name == "run" else ["--json", "--plot"])
    for flag in flags:
        for target, why in (("/dev/full", "/dev/full: cannot be written (No space left on "
                                          "device)"),
                            (tmp_path / "f" / "o.json", f"{tmp_path / 'f'} is not a folder")):
            args = ([name, src, *more] if name == "run" else [name, "--num-prompts", "1"])
            r = cli(*args, "--model", tokenizer_only, flag, target,
                    *(["-o", tmp_path / "out.jsonl"] if flag == "--metrics-json" else []))
            assert r.exit_code == 1, (flag, r.output)
            assert why in r.stderr and "Traceback" not in r.output
    assert (tmp_path / "f").read_text() == "x" and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("kind", ["missing", "no-config", "not-gguf"])
def test_a_local_model_that_cannot_be_had_is_named_before_the_input_is_read(tmp_path, kind):
    """A missing path, a folder without config.json or a file that is not a .gguf: said
    before any row is read (it was found only by the load after the whole input was
    checked); a repo id that cannot be had already was (tests/loader/test_hub.py)."""
    model = tmp_path / "model"
    if kind == "no-config":
        model.mkdir()
    elif kind == "not-gguf":
        model.write_bytes(b"\0")
    want = {"missing": f"--model {model}: no such folder or file",
            "no-config": f"Model folder {model} has no config.json",
            "not-gguf": f"--model {model}: a file, but not a .gguf"}[kind]
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}, {"not a row": 1}])
    for command in (["run", src, "-o", tmp_path / "o.jsonl"], ["plan", src]):
        r = cli(*command, "--model", model)
        assert r.exit_code == 1, r.output
        assert r.stderr.startswith(f"error: {want}"), r.stderr
        assert "rows checked" not in r.stderr and "line 2" not in r.stderr
