"""Issue 12 items 1-2: token ids from a row are checked against the model's vocabulary before
anything indexes with them, and numerically degenerate sampling values are greedy or errors.

Oracles: a row's output run alone (its neighbour must not change it), mlx-lm's greedy
generation, the hand-computed vocabulary size of the tiny models (256) and the default model
(262,144)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.data import InputError, read_rows
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.worker.sampling import sample_one as sample_row
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_llama

QUIET = RunOptions(show_progress=False)
SKIP = RunOptions(show_progress=False, skip_invalid=True)
A_PROMPT, B_PROMPT = "Here is a short list of fruits: apple, banana,", "One, two, three,"


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(), byte_tokenizer(eos_id=-1)


def _engine(model, tok) -> LLMEngine:
    return LLMEngine(EngineConfig(num_blocks=64), model, tok)


def _greedy(model, tok, prompt: str, n: int) -> list[int]:
    ids = mx.array(tok.encode(prompt))
    return [int(t) for t, _ in generate_step(ids, model, max_tokens=n)]


def test_engine_refuses_out_of_vocabulary_ids_and_the_neighbour_is_unchanged(tiny):
    model, tok = tiny
    ref_b = _greedy(model, tok, B_PROMPT, 4)
    for bad in (VOCAB + ref_b[0], VOCAB, 1 << 40):
        a = PromptInput("A", tok.encode(A_PROMPT),
                        SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(bad,)))
        b = PromptInput("B", tok.encode(B_PROMPT), SamplingParams(max_tokens=4))
        outs = {o.request_id: o for o in _engine(model, tok).generate([a, b])}
        assert outs["B"].token_ids == ref_b
        assert outs["A"].error == (f'field "stop_token_ids": token id {bad} is outside the '
                                   f"model's vocabulary ({VOCAB} ids, 0..{VOCAB - 1})")
    prompt = PromptInput("P", [5, VOCAB + 3], SamplingParams(max_tokens=2))
    (out,) = _engine(model, tok).generate([prompt])
    assert 'field "prompt_token_ids": token id 259' in out.error


def test_min_tokens_mask_never_indexes_past_the_logits(tiny):
    """The step's scatter is bounds-checked itself (defence below the engine's check)."""
    from mlxpa.worker.sample_step import mask_early_stops

    class Req:  # the two fields the mask reads
        num_output_tokens = 0
        sampling_params = SamplingParams(max_tokens=3, min_tokens=2, stop_token_ids=(VOCAB,))

    logits = mx.zeros((2, VOCAB))
    with pytest.raises(IndexError, match="outside the logits"):
        mask_early_stops(logits, [Req(), Req()], [0])


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


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, 9.99e-6, 5e-324])
def test_temperatures_below_vllm_eps_are_greedy(tmp_path, tiny, temperature):
    model, tok = tiny
    ref = _greedy(model, tok, B_PROMPT, 6)
    p = PromptInput("t", tok.encode(B_PROMPT),
                    SamplingParams(max_tokens=6, temperature=temperature, seed=1))
    (out,) = _engine(model, tok).generate([p])
    assert out.token_ids == ref


def test_huge_temperature_keeps_filtered_tokens_out():
    """T = 1e39 overflows float32 (1/T underflows to 0): the two top-k tokens stay the only
    candidates, each drawn (uniformly) and nothing else, never a NaN draw."""
    logits = mx.array(np.linspace(-5, 5, 64, dtype=np.float32)[None])
    drawn = {int(sample_row(logits, SamplingParams(temperature=1e39, top_k=2), seed, 0).item())
             for seed in range(64)}
    assert drawn == {62, 63}
    drawn = {int(sample_row(logits, SamplingParams(temperature=3e38, top_p=1e-300), s, 0).item())
             for s in range(16)}
    assert drawn == {63}


@pytest.mark.parametrize("text,field", [
    ('{"prompt": "x", "temperature": NaN}', "temperature"),
    ('{"prompt": "x", "top_p": Infinity}', "top_p"),
    ('{"prompt": "x", "min_p": -Infinity}', "min_p"),
    ('{"prompt": "x", "max_tokens": Infinity}', "max_tokens"),
    ('{"prompt": "x", "seed": NaN}', "seed"),
    ('{"prompt": "x", "stop_token_ids": [NaN]}', "stop_token_ids"),
    ('{"custom_id": "c", "body": {"prompt": "x", "temperature": -Infinity}}', "body.temperature"),
])
def test_nan_and_infinity_are_validation_errors(tmp_path, text, field):
    src = tmp_path / "in.jsonl"
    src.write_text(text + "\n")
    (row,) = read_rows(str(src))
    assert row.error.startswith(f'{src} line 1: field "{field}" must be ')
    assert row.error.endswith(("got NaN", "got Infinity", "got -Infinity", "got [NaN]"))


def test_cli_temperature_must_be_finite():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            SamplingParams(temperature=bad)


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
