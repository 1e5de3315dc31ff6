"""The command-line text a newcomer reads: help at 80 columns, usage and metavars, flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.sampling_params import SamplingParams

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _help(command: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-m", "mlxpa", *command.split(), "--help", "--blas",
                        "bundled"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


USAGE_ARGS = {"run": " INPUT", "plan": " INPUT", "bench": " [COMMAND [ARGS]...]",
              "bench serve": "", "serve": " [MODEL]"}


@pytest.mark.parametrize("command", ["run", "plan", "bench", "bench serve", "serve"])
def test_help_fits_80_columns_without_type_metavars(command):
    text = _help(command)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == f"Usage: mlxpa {command} [OPTIONS]" + USAGE_ARGS[command]
    for bad in ("<bool>", "<str>", "<int>", "<float>", "{", "…"):
        assert bad not in text, bad


def test_run_help_is_short_and_names_every_flag_whole():
    text = _help("run")
    assert len(text.splitlines()) < 140  # one screen-ish page; every option named whole
    assert "--enable-prefix-caching / --no-enable-prefix-caching" in text
    assert "-q, --quiet  " in text  # a flag: no metavar after it


def test_top_k_minus_one_is_off_as_in_rows():
    assert SamplingParams(top_k=-1).top_k == 0
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


def test_help_reads_whole_at_80_columns():
    def help_of(*cmd):
        r = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        return r.output

    top = help_of()
    assert "..." not in top.split("Commands:")[1]
    assert re.search(r"\n  run +Generate a completion for every row", top)  # whole, any column
    bench = help_of("bench")
    assert "``" not in bench and "mlx-\n" not in bench
    assert "only what the work can use" in " ".join(bench.split())
    for cmd in ("run", "plan"):
        text = help_of(cmd)
        assert ".tsv, .txt" in text and "--blas [auto|system|bundled]" in text
    assert "Output tokens of a row that does not set max_tokens" in " ".join(
        help_of("plan").split())

