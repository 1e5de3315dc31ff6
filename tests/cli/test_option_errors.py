"""A bad command-line option is one ``error:`` line on stderr naming the flag as typed (exit
2), before any input is read or model loaded: a value out of range (the library's own check,
its field renamed to the flag), a value click cannot convert, an unknown option, a missing
argument. Not click's four-line usage block."""

from __future__ import annotations

import pytest

from tests.cli.helpers import cli, write_jsonl


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> str:
    return write_jsonl(tmp_path_factory.mktemp("rows") / "in.jsonl", [{"prompt": "hi"}])


@pytest.mark.parametrize(("args", "line"), [
    (["run", "{rows}", "--temperature", "-1"],
     "--temperature must be a finite number >= 0, got -1.0"),
    (["run", "{rows}", "--temperature", "abc"],
     "--temperature: Input should be a valid number, unable to parse string as a number"),
    (["run", "{rows}", "--top-p", "2"], "--top-p must be a number in (0, 1], got 2.0"),
    (["run", "{rows}", "--top-k", "-5"], "--top-k must be an integer >= 0 (or -1: off), got -5"),
    (["run", "{rows}", "--min-tokens", "-1"], "--min-tokens must be an integer >= 0, got -1"),
    (["run", "{rows}", "--max-tokens", "x"],
     "--max-tokens: Input should be a valid integer, unable to parse string as an integer"),
    (["run", "{rows}", "--n", "0"], "--n must be an integer from 1 to 1024, got 0"),
    (["run", "{rows}", "--repetition-penalty", "0"],
     "--repetition-penalty must be a finite number > 0 (1: off), got 0.0"),
    (["run", "{rows}", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    (["run", "{rows}", "--max-num-seqs", "0"], "--max-num-seqs must be an integer >= 1, got 0"),
    (["run", "{rows}", "--kv-cache-dtype", "fp8"],
     "--kv-cache-dtype: 'fp8' is not one of 'auto', 'int8', 'int4', 'k8v4'."),
    (["run", "{rows}", "--tempreture", "1"],
     "No such option: --tempreture (Possible options: --resume, --temperature)"),
    (["run"], "Missing argument 'INPUT'."),
    (["plan", "{rows}", "--block-size", "3"],
     "--block-size must be a power of two from 1 to 256, got 3"),
    (["plan", "{rows}", "--max-tokens", "-1"], "--max-tokens must be an integer >= 0, got -1"),
    (["plan", "{rows}", "--kv-memory", "-1"], "--kv-memory must be > 0, got -1.0"),
    (["serve", "--kv-segment-bytes", "-1"],
     "--kv-segment-bytes must be an integer >= 0 (0: the whole budget at start), got -1"),
    (["plan", "{rows}", "--top", "-1"], "--top: Input should be greater than or equal to 0"),
    (["bench", "--num-prompts", "0"],
     "--num-prompts: Input should be greater than or equal to 1"),
    (["bench", "--output-len", "x"],
     "--output-len: Input should be a valid integer, unable to parse string as an integer"),
    (["bench", "--range-ratio", "1"], "--range-ratio: must be below 1, got 1.0"),
])
def test_option_error_is_one_line_naming_the_flag(rows, args, line):
    r = cli(*(a.format(rows=rows) for a in args), "--model", "/no/such/model")
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: {line}\n"
    assert r.stdout == ""
