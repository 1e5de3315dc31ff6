"""``mlxpa bench``'s checks before any work: output paths, ``--workload file`` needs
``--input`` and checks its rows as ``run`` does (named, counted, skipped)."""

from __future__ import annotations

import json

from tests.cli.helpers import ROBOT, cli, write_jsonl


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



def test_bench_file_workload_leaves_out_rows_with_max_tokens_0(tmp_path, tiny):
    """A valid row with ``max_tokens: 0`` generates nothing, so there is nothing to time, and
    mlx-lm's generators refuse it (the mlx-lm and static baselines stopped the bench with
    "max_tokens must be > 0"): it is left out with a warning that counts it; the other rows
    are timed by every system (the oracle: the JSON's token count)."""
    src = write_jsonl(tmp_path / "rows.jsonl", [
        {"id": "a", "prompt": "hello", "max_tokens": 3}, {"id": "z", "prompt": "x",
                                                          "max_tokens": 0},
        {"id": "b", "prompt": "world", "max_tokens": 2}])
    out = tmp_path / "f.json"
    r = cli("bench", "--model", tiny, "--workload", "file", "--input", src, "--baselines",
            "mlxpa,mlx-lm,static", "--json", out, "--kv-memory", "0.01", "-q")
    assert r.exit_code == 0, r.output
    assert f"warning: left out 1 row(s) of {src} with max_tokens 0 (nothing to time)" in (
        " ".join(r.stderr.split()))
    assert "file: 2 prompts, " in r.stderr
    data = json.loads(out.read_text())
    assert data["workload"]["output_tokens"] == 5
    assert set(data["systems"]) == {"mlxpa", "mlx-lm", "static"}
