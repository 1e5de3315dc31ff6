"""``mlxpa run`` end to end on a tiny model (Typer's CliRunner): validation before the model
loads, CSV / datasets / OpenAI Batch inputs and outputs, --keep-columns and --system, the stop
and decode fields per row and as CLI defaults, --resume, --unordered, windowed prefix order."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pyarrow.parquet as pq
import pytest
from mlx_lm.generate import generate_step
from typer.testing import CliRunner

from mlxpa.batch.run import RunOptions, run_file
from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.data import InputOptions
from mlxpa.engine import LLMEngine
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(folder, tokenizer, greedy token ids of PROMPT ignoring EOS)``."""
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")
    model, tok, _ = load_model(EngineConfig(model=folder))
    ref = [int(t) for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=12)]
    return folder, tok, ref


def invoke(args, input=None):
    return CliRunner().invoke(app, ["run", *args, "--kv-memory", "0.01", "-q"], input=input)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_invalid_rows_stop_before_the_model_loads(tmp_path, tiny, tokenizer_only):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "x"}\n\n{oops\n{"id": "a", "prompt": "y"}\n'
                   '{"prompt": "z", "top_p": "high", "temprature": 1}\n')
    out = tmp_path / "out.jsonl"
    r = invoke([str(src), "-o", str(out), "--model", tokenizer_only])  # no weights to load
    assert r.exit_code == 2, r.output
    assert f"{src}: 3 invalid row(s) of 4; nothing was run" in r.stderr
    assert f"{src} line 3: invalid JSON" in r.stderr
    assert f'{src} line 4: duplicate id "a" (first at line 1)' in r.stderr
    assert f'{src} line 5: field "temprature": unknown sampling field' in r.stderr
    assert 'field "top_p" must be a number in (0, 1], got "high"' in r.stderr
    assert not out.exists()
    r = invoke([str(src), "-o", str(out), "--model", tiny[0], "--max-tokens", "2",
                "--skip-invalid"])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    assert [(row["id"], row["finish_reason"]) for row in rows] == [
        ("a", "length"), (None, "error"), ("a", "error"), (3, "error")]
    assert rows[2]["error"] == f'{src} line 4: duplicate id "a" (first at line 1)'


def test_csv_in_keep_columns_and_system(tmp_path, tiny):
    src = tmp_path / "in.csv"
    src.write_text("key,question,cat\nk1,hello there,A\nk2,what now,B\n")
    out = tmp_path / "out.jsonl"
    r = invoke([str(src), "-o", str(out), "--model", tiny[0], "--max-tokens", "3",
                "--prompt-column", "question", "--id-column", "key", "--keep-columns",
                "cat,question", "--system", "Sys"])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    assert [(row["id"], row["cat"], row["question"]) for row in rows] == [
        ("k1", "A", "hello there"), ("k2", "B", "what now")]
    # the system text and a blank line go before each prompt (one token a character)
    assert rows[0]["prompt_tokens"] == len("Sys\n\nhello there")
    r = invoke([str(src), "--model", tiny[0], "--keep-columns", "text"])
    assert r.exit_code == 2 and "an output field has that name" in r.output


def test_datasets_folder_to_parquet(tmp_path, tiny):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"prompt": ["hello", "world"], "max_tokens": [2, 3]}).save_to_disk(
        str(tmp_path / "ds"))
    out = tmp_path / "out.parquet"
    r = invoke([str(tmp_path / "ds"), "-o", str(out), "--model", tiny[0]])
    assert r.exit_code == 0, r.output
    t = pq.read_table(out).to_pylist()
    assert [(row["id"], row["completion_tokens"]) for row in t] == [(0, 2), (1, 3)]
    r = invoke(["someone/dataset", "--model", tiny[0]])
    assert r.exit_code == 2 and "cannot be downloaded here" in r.stderr


def test_openai_batch_in_and_out(tmp_path, tiny):
    folder, tok, ref = tiny
    src = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "one", "method": "POST", "url": "/v1/completions",
         "body": {"model": "gpt", "prompt": PROMPT, "max_tokens": 4, "n": 2}},
        {"custom_id": "two", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--skip-invalid"])
    assert r.exit_code == 0, r.output
    one, two = read_jsonl(out)
    assert (one["id"], one["custom_id"], one["error"]) == ("batch_req_0", "one", None)
    body = one["response"]["body"]
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert [c["text"] for c in body["choices"]] == [tok.decode(ref[:4])] * 2
    assert body["usage"]["completion_tokens"] == 8
    # the tiny model has no chat template: an error line for that row
    assert two["response"] is None and "chat template" in two["error"]["message"]
    r = invoke([src, "-o", str(tmp_path / "rows.jsonl"), "--model", folder, "--skip-invalid",
                "--output-format", "mlxpa"])
    assert [row["id"] for row in read_jsonl(tmp_path / "rows.jsonl")] == ["one", "one", "two"]
    # An invalid line (no custom_id) does not switch a Batch file's output to mlxpa rows.
    with open(src, "a") as f:
        f.write(json.dumps({"method": "POST", "url": "/v1/completions",
                            "body": {"prompt": PROMPT}}) + "\n")
    out = tmp_path / "out3.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--skip-invalid"])
    assert r.exit_code == 0, r.output
    lines = read_jsonl(out)
    assert len(lines) == 3 and all("custom_id" in line for line in lines)
    assert lines[2]["response"] is None and lines[2]["error"]["code"]


def test_stop_and_decode_fields(tmp_path, tiny):
    folder, tok, ref = tiny
    full = tok.decode(ref)
    k = ref.index(ref[3])
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "stop-ids", "prompt": PROMPT, "stop_token_ids": [ref[3]]},
        {"id": "both-stops", "prompt": PROMPT, "stop": [full[2:5], full[2:4]]},
        {"id": "include", "prompt": PROMPT, "stop": full[2:4], "include_stop_str_in_output": True},
        {"id": "first-is-stop", "prompt": PROMPT, "stop_token_ids": [ref[0]]},
        {"id": "min-tokens", "prompt": PROMPT, "stop_token_ids": [ref[0]], "min_tokens": 3},
        {"id": "beyond-context", "prompt": PROMPT, "max_tokens": 100000},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "12", "--ignore-eos",
                "--max-model-len", "40"])
    assert r.exit_code == 0, r.output
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert rows["stop-ids"]["text"] == tok.decode(ref[:k])
    assert rows["stop-ids"]["completion_tokens"] == k + 1
    assert rows["both-stops"]["text"] == full[:2]  # the earliest of overlapping stops
    assert rows["include"]["text"] == full[:4]
    assert (rows["first-is-stop"]["text"], rows["first-is-stop"]["completion_tokens"]) == ("", 1)
    assert rows["min-tokens"]["completion_tokens"] >= 3
    prompt_tokens = rows["beyond-context"]["prompt_tokens"]
    assert rows["beyond-context"]["finish_reason"] == "length"
    assert rows["beyond-context"]["completion_tokens"] == 40 - prompt_tokens
    # the same stops as CLI defaults
    src2 = write_jsonl(tmp_path / "in2.jsonl", [{"prompt": PROMPT}])
    for args, text in [(["--stop", full[2:4], "--include-stop-str"], full[:4]),
                       (["--stop-token-id", str(ref[3])], tok.decode(ref[:k]))]:
        r = invoke([src2, "-o", str(out), "--model", folder, "--max-tokens", "12",
                    "--ignore-eos", "--overwrite", *args])
        assert r.exit_code == 0, r.output
        assert read_jsonl(out)[0]["text"] == text
    r = invoke([src2, "--model", folder, "--min-tokens", "-1"])
    assert r.exit_code == 2 and "--min-tokens must be an integer >= 0, got -1" in r.output


def test_ignore_eos_default(tmp_path, tiny):
    folder, tok, ref = tiny
    eos_folder = tmp_path / "eos"
    shutil.copytree(folder, eos_folder)
    config = json.loads((eos_folder / "config.json").read_text())
    (eos_folder / "config.json").write_text(json.dumps({**config, "eos_token_id": ref[0]}))
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": PROMPT}])
    out = tmp_path / "out.jsonl"
    assert invoke([src, "-o", str(out), "--model", str(eos_folder), "--max-tokens", "5"]
                  ).exit_code == 0
    assert [(r["finish_reason"], r["completion_tokens"]) for r in read_jsonl(out)] == [("stop", 1)]
    assert invoke([src, "-o", str(out), "--model", str(eos_folder), "--max-tokens", "5",
                   "--ignore-eos", "--overwrite"]).exit_code == 0
    assert [(r["finish_reason"], r["text"]) for r in read_jsonl(out)] == [
        ("length", tok.decode(ref[:5]))]


def test_resume_appends_the_rest(tmp_path, tiny):
    folder, tok, ref = tiny
    rows = [{"id": f"r{i}", "prompt": f"{PROMPT} {i}"} for i in range(6)]
    src = write_jsonl(tmp_path / "in.jsonl", rows[:3])
    out = tmp_path / "out.jsonl"
    assert invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "3"]).exit_code == 0
    first = out.read_text()
    with open(out, "a") as f:
        f.write('{"id": "r3", "text": "to')  # a torn last line
    write_jsonl(tmp_path / "in.jsonl", rows)
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "3", "--resume"])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith(first)
    assert [row["id"] for row in read_jsonl(out)] == [f"r{i}" for i in range(6)]
    r = invoke([src, "-o", str(out), "--model", folder, "--resume", "--output-format", "openai"])
    assert r.exit_code == 1 and "cannot resume" in r.stderr
    r = invoke([src, "--model", folder, "--resume"])
    assert r.exit_code == 2 and "needs an output file" in r.output


def test_unordered_and_windowed_prefix_order(tmp_path, tiny):
    folder, tok, ref = tiny
    prompts = ["shared prefix " * 3 + str(i % 3) if i % 2 else f"other {i}" for i in range(9)]
    src = write_jsonl(tmp_path / "in.jsonl",
                      [{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    model, mtok, _ = load_model(EngineConfig(model=folder))
    texts = {}
    for name, kw in [("input", dict(order="input")), ("window", dict(window=4)),
                     ("unordered", dict(ordered=False))]:
        out = tmp_path / f"{name}.jsonl"
        engine = LLMEngine(EngineConfig(num_blocks=64, block_size=4), model, mtok)
        run_file(src, str(out), EngineConfig(), SamplingParams(max_tokens=4),
                 RunOptions(show_progress=False, **kw), inputs=InputOptions(), engine=engine)
        got = read_jsonl(out)
        texts[name] = {row["id"]: row["text"] for row in got}
        if name != "unordered":
            assert [row["id"] for row in got] == list(range(9))
    assert texts["input"] == texts["window"] == texts["unordered"]


def test_missing_output_folder_fails_before_the_model_loads(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "x"}])
    out = tmp_path / "no-such-folder" / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", str(tmp_path / "no-such-model")])
    assert r.exit_code == 1, r.output
    assert f"the output folder {tmp_path / 'no-such-folder'} does not exist" in r.stderr
    assert "no-such-model" not in r.stderr  # the model was never looked up


def test_failed_rows_are_counted_in_the_report(tmp_path, tiny):
    folder, _, _ = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": PROMPT},
                                              {"id": "b", "prompt": ""},
                                              {"id": "c", "prompt": PROMPT, "max_tokens": 2}])
    out, metrics = tmp_path / "out.jsonl", tmp_path / "m.json"
    r = CliRunner().invoke(app, ["run", src, "-o", str(out), "--model", str(folder),
                                 "--kv-memory", "0.01", "--max-tokens", "3", "--skip-invalid",
                                 "--metrics-json", str(metrics)])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    assert [bool(row.get("error")) for row in rows] == [False, True, False]
    assert json.loads(metrics.read_text())["failed_rows"] == 1
    assert "1 row(s) failed" in r.stderr


def test_version_and_bad_blas_mode():
    import subprocess
    import sys
    from importlib.metadata import version

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"mlxpa {version('mlxpa')}"
    p = subprocess.run([sys.executable, "-m", "mlxpa", "run", "x.jsonl", "--blas", "bogus"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "--blas must be one of auto, system, bundled, got 'bogus'" in p.stderr


def test_resume_runs_error_rows_again(tmp_path, tiny):
    folder = tiny[0]
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"id": "a", "prompt": PROMPT}, {"id": "b", "prompt": ""}])
    out = tmp_path / "out.jsonl"
    r = invoke([str(src), "-o", str(out), "--model", folder, "--max-tokens", "2",
                "--skip-invalid"])
    assert r.exit_code == 0, r.output
    first = read_jsonl(out)
    assert [row["finish_reason"] for row in first] == ["length", "error"]
    write_jsonl(src, [{"id": "a", "prompt": PROMPT}, {"id": "b", "prompt": PROMPT}])
    r = invoke([str(src), "-o", str(out), "--model", folder, "--max-tokens", "2", "--resume"])
    assert r.exit_code == 0, r.output
    assert "removed 1 error row(s); they run again" in r.stderr
    assert "1 row(s) already done, 1 to run" in r.stderr
    rows = read_jsonl(out)
    assert rows[0] == first[0]
    assert [(row["id"], row["finish_reason"]) for row in rows] == [("a", "length"),
                                                                   ("b", "length")]
    assert rows[1]["text"] == rows[0]["text"]  # same prompt, greedy


def test_empty_input_writes_an_empty_output_without_a_model(tmp_path, tokenizer_only):
    src = tmp_path / "empty.jsonl"
    src.write_text("\n")
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(app, ["run", str(src), "-o", str(out), "--model",
                                 tokenizer_only])  # no weights: a load would fail
    assert r.exit_code == 0, r.output
    assert out.read_text() == ""
    assert "no rows; wrote an empty output" in r.stderr


def test_output_that_is_a_folder_fails_before_the_model_loads(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "x"}])
    r = invoke([src, "-o", str(tmp_path), "--model", str(tmp_path / "no-such-model")])
    assert r.exit_code == 1 and f"{tmp_path} is a folder; give a file path" in r.stderr
    r = invoke([src, "-o", str(tmp_path / "o.jsonl"), "--metrics-json",
                str(tmp_path / "nope" / "m.json"), "--model", str(tmp_path / "no-such-model")])
    assert r.exit_code == 1 and "the output folder" in r.stderr and "nope" in r.stderr


def test_seed_is_the_engine_seed(tmp_path, tiny):
    folder = tiny[0]
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": PROMPT}] * 4)

    def texts(seed):
        out = tmp_path / f"out{seed}.jsonl"
        r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "8",
                    "--temperature", "1.5", "--seed", str(seed), "--ignore-eos", "--overwrite"])
        assert r.exit_code == 0, r.output
        return [row["text"] for row in read_jsonl(out)]

    a = texts(7)
    assert len(set(a)) > 1  # identical prompts sample differently (seeds differ per row)
    assert texts(7) == a and texts(8) != a


def test_existing_output_needs_overwrite_or_resume(tmp_path, tiny):
    """A forgotten --resume must not destroy finished work; unknown output extensions are
    refused instead of getting JSONL."""
    folder = tiny[0]
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": PROMPT, "max_tokens": 2}])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 0, "text": "kept"}\n')
    r = invoke([src, "-o", str(out), "--model", folder])
    assert r.exit_code == 2 and "--overwrite" in r.output and "--resume" in r.output
    assert out.read_text() == '{"id": 0, "text": "kept"}\n'
    assert invoke([src, "-o", str(out), "--model", folder, "--overwrite"]).exit_code == 0
    assert read_jsonl(out)[0]["completion_tokens"] == 2
    r = invoke([src, "-o", str(tmp_path / "out.csv"), "--model", folder])
    assert r.exit_code == 1 and ".jsonl" in r.output and not (tmp_path / "out.csv").exists()


def test_no_cascade_attention_reaches_the_engine_config(tmp_path, tiny, monkeypatch):
    """``--disable-cascade-attn`` turns cascade attention off (EngineConfig.disable_cascade_attn;
    on by default); the run's output is the same either way."""
    import importlib

    run_cli = importlib.import_module("mlxpa.cli.run")  # the package binds `run` to the command
    seen = []
    command = run_cli._run_command

    def spy(input, output, config, *args):
        seen.append(not config.disable_cascade_attn)
        return command(input, output, config, *args)

    monkeypatch.setattr(run_cli, "_run_command", spy)
    folder, _, _ = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": PROMPT + f" {i}"} for i in range(3)])
    texts = []
    for flags in ([], ["--disable-cascade-attn"]):
        out = tmp_path / f"out{len(flags)}.jsonl"
        r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "5", *flags])
        assert r.exit_code == 0, r.output
        texts.append([row["text"] for row in read_jsonl(out)])
    assert seen == [True, False] and texts[0] == texts[1]
