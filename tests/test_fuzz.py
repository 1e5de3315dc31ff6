"""The input fuzzer: random files, formats and engine options through
``run_file`` on a tiny random model, the invariants of :func:`tests.fuzz_inputs.check_case`;
and a few hostile files through ``python -m mlxpa run`` for the exit status.

Examples: ``MLXPA_FUZZ_EXAMPLES`` (default 300, a CI-sized run; ``scripts/fuzz.py`` runs
10,000)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from mlx_lm.tokenizer_utils import TokenizerWrapper

from tests.fuzz_inputs import Case, cases, check_case, write_case
from tests.tiny_models import byte_tokenizer, save_tiny_model, tiny_llama

pytestmark = pytest.mark.slow  # hundreds of runs, and subprocess runs
EXAMPLES = int(os.environ.get("MLXPA_FUZZ_EXAMPLES", "300"))
TEMPLATE = ("{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
            "{% if add_generation_prompt %}<bos>assistant\n{% endif %}")


def chat_tokenizer() -> TokenizerWrapper:
    fast = byte_tokenizer()._tokenizer
    fast.chat_template = TEMPLATE
    return TokenizerWrapper(fast, eos_token_ids={1})


MODEL, TOK = tiny_llama(), chat_tokenizer()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 300,
          suppress_health_check=list(HealthCheck))
@given(case=cases)
def test_fuzz_run_invariants(case: Case):
    with tempfile.TemporaryDirectory() as tmp:
        result = check_case(case, Path(tmp), MODEL, TOK)
    event(f"{case.fmt} {result.split(' ')[0]} {result.split(' ')[1]}")


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(case=cases)
def test_fuzz_cli_exit_status(case: Case):
    """Through the CLI in a subprocess: no signal, no traceback, exit 0 or 2 (0 with
    --skip-invalid), one record per row or sample on exit 0."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = save_tiny_model(tmp / "m", chat_template=TEMPLATE)
        ext = {"openai": "jsonl"}.get(case.fmt, case.fmt)
        src, out = tmp / f"in.{ext}", tmp / "out.jsonl"
        write_case(case, src)
        o = case.options
        args = [sys.executable, "-m", "mlxpa", "run", str(src), "-o", str(out), "--model",
                model, "-q", "--block-size", str(o["block_size"]), "--max-num-seqs",
                str(o["max_num_seqs"]), "--max-num-batched-tokens",
                str(o["max_num_batched_tokens"]), "--max-model-len", str(o["max_model_len"]),
                "--kv-memory", "0.001", "--max-tokens", str(case.defaults.max_tokens),
                *(["--skip-invalid"] if case.skip_invalid else [])]
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert r.returncode in ((0,) if case.skip_invalid else (0, 2)), r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        if r.returncode == 0:
            assert len([json.loads(x) for x in out.read_text().split("\n") if x]) >= len(case.rows)


@pytest.mark.parametrize("text", [
    '{"prompt": "x", "temperature": NaN}\n{"prompt": "y"}\n',
    '{"id": "A", "prompt": "abc", "min_tokens": 1, "stop_token_ids": [1099511627776]}\n',
    '{"prompt": "a", "seed": ' + "9" * 5000 + "}\n" + '{"prompt": [[[' + "[" * 50000 + "}\n",
])
def test_cli_hostile_files_exit_2_or_0(tmp_path, text):
    model = save_tiny_model(tmp_path / "m")
    src = tmp_path / "in.jsonl"
    src.write_text(text)
    base = [sys.executable, "-m", "mlxpa", "run", str(src), "--model", model, "-q",
            "--kv-memory", "0.001", "--max-tokens", "2"]
    r = subprocess.run([*base, "-o", str(tmp_path / "a.jsonl")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{src} line 1: " in r.stderr
    r = subprocess.run([*base, "-o", str(tmp_path / "b.jsonl"), "--skip-invalid"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    assert len(lines) == text.count("\n")
