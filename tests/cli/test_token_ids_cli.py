"""``mlxpa run`` refuses token ids outside the model's vocabulary before the model runs,
naming file, line, field and vocabulary size; with ``--skip-invalid`` such a row is an error
row and its neighbour's output is mlx-lm's greedy generation.

Oracles: mlx-lm's greedy generation, the hand-computed vocabulary size of the tiny models (256)
and the default model (262,144)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig
from mlxpa.data import InputError
from mlxpa.engine import LLMEngine
from mlxpa.sampling_params import SamplingParams
from tests.engine.test_input_bounds import A_PROMPT, B_PROMPT, _engine, _greedy
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_llama

QUIET = RunOptions(show_progress=False)
SKIP = RunOptions(show_progress=False, skip_invalid=True)


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(), byte_tokenizer(eos_id=-1)



def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)



def test_run_names_file_line_field_and_vocabulary_size(tmp_path, tiny):
    model, tok = tiny
    ref_b = _greedy(model, tok, B_PROMPT, 4)
    rows = [{"id": "A", "prompt": A_PROMPT, "max_tokens": 4, "min_tokens": 2,
             "stop_token_ids": [VOCAB + ref_b[0]]},
            {"id": "B", "prompt": B_PROMPT, "max_tokens": 4},
            {"id": "C", "prompt": B_PROMPT, "max_tokens": 4, "min_tokens": 1,
             "stop_token_ids": [3, 1099511627776]}]
    src, out = _write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    with pytest.raises(InputError) as e:
        run_file(src, str(out), EngineConfig(), SamplingParams(), QUIET,
                 engine=_engine(model, tok))
    msg = str(e.value)
    assert (f'{src} line 1: field "stop_token_ids": token id {VOCAB + ref_b[0]} is outside '
            f"the model's vocabulary (256 ids, 0..255)") in msg
    assert f'{src} line 3: field "stop_token_ids": token id 1099511627776 is outside' in msg
    assert not out.exists()
    run_file(src, str(out), EngineConfig(), SamplingParams(), SKIP,
             engine=_engine(model, tok))
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["finish_reason"] for g in got] == ["error", "length", "error"]
    assert got[1]["text"] == tok.decode(ref_b)



def test_openai_body_ids_are_named_with_body_prefix(tmp_path, tiny):
    model, tok = tiny
    line = {"custom_id": "q", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": "x", "stop_token_ids": [VOCAB]}}
    src = _write(tmp_path / "b.jsonl", [line])
    with pytest.raises(InputError, match=r'line 1: field "body.stop_token_ids": token id 256'):
        run_file(src, str(tmp_path / "o.jsonl"), EngineConfig(), SamplingParams(), QUIET,
                 engine=_engine(model, tok))



@pytest.mark.real_model
def test_issue_example_on_the_default_model(tmp_path, default_model):
    model, tok, _ = default_model
    vocab = 262144
    four = tok.encode(" four", add_special_tokens=False)[0]
    rows = [{"id": "A", "prompt": A_PROMPT, "max_tokens": 4, "min_tokens": 2,
             "stop_token_ids": [vocab + four]}, {"id": "B", "prompt": B_PROMPT, "max_tokens": 4}]
    src, out = _write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    engine = LLMEngine(EngineConfig(num_blocks=64), model, tok)
    msg = rf'line 1: field "stop_token_ids": token id {vocab + four} is outside the model'
    with pytest.raises(InputError, match=msg + r"'s vocabulary \(262144 ids"):
        run_file(src, str(out), EngineConfig(), SamplingParams(), QUIET, engine=engine)
    run_file(src, str(out), EngineConfig(), SamplingParams(), SKIP, engine=engine)
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    ref = [int(t) for t, _ in generate_step(mx.array(tok.encode(B_PROMPT)), model, max_tokens=4)]
    assert got["B"]["text"] == tok.decode(ref) == " four, five,"
    assert got["A"]["finish_reason"] == "error"

