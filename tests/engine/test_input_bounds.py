"""Inputs at their bounds below the file run: the engine refuses token ids outside the
vocabulary before anything indexes with them (and the step's mask checks its own), and
numerically degenerate sampling values are greedy (engine, sampling) or errors (rows,
``SamplingParams``). ``mlxpa run``'s side: ``tests/cli/test_token_ids_cli.py``.

Oracles: a row's output run alone (its neighbour must not change it), mlx-lm's greedy
generation, the hand-computed vocabulary size of the tiny models (256)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.data import read_rows
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.topk_topp_sampler import sample_one as sample_row
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_llama

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
        a = EngineRequest("A", tok.encode(A_PROMPT),
                        SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(bad,)))
        b = EngineRequest("B", tok.encode(B_PROMPT), SamplingParams(max_tokens=4))
        outs = {o.request_id: o for o in _engine(model, tok).generate([a, b])}
        assert outs["B"].token_ids == ref_b
        assert outs["A"].error == (f'field "stop_token_ids": token id {bad} is outside the '
                                   f"model's vocabulary ({VOCAB} ids, 0..{VOCAB - 1})")
    prompt = EngineRequest("P", [5, VOCAB + 3], SamplingParams(max_tokens=2))
    (out,) = _engine(model, tok).generate([prompt])
    assert 'field "prompt_token_ids": token id 259' in out.error


def test_min_tokens_mask_never_indexes_past_the_logits(tiny):
    """The step's scatter is bounds-checked itself (defence below the engine's check)."""
    from mlxpa.worker.sampler import mask_early_stops

    class Req:  # the two fields the mask reads
        num_output_tokens = 0
        sampling_params = SamplingParams(max_tokens=3, min_tokens=2, stop_token_ids=(VOCAB,))

    logits = mx.zeros((2, VOCAB))
    with pytest.raises(IndexError, match="outside the logits"):
        mask_early_stops(logits, [Req(), Req()], [0])


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, 9.99e-6, 5e-324])
def test_temperatures_below_vllm_eps_are_greedy(tmp_path, tiny, temperature):
    model, tok = tiny
    ref = _greedy(model, tok, B_PROMPT, 6)
    p = EngineRequest("t", tok.encode(B_PROMPT),
                    SamplingParams(max_tokens=6, temperature=temperature, seed=1))
    (out,) = _engine(model, tok).generate([p])
    assert out.token_ids == ref


def test_huge_temperature_keeps_filtered_tokens_out():
    """T = 1e39 overflows float32 (1/T underflows to 0): the two top-k tokens stay the only
    candidates, each drawn (uniformly) and nothing else, never a NaN draw."""
    logits = np.linspace(-5, 5, 64, dtype=np.float32)
    drawn = {sample_row(logits, SamplingParams(temperature=1e39, top_k=2), seed, 0)
             for seed in range(64)}
    assert drawn == {62, 63}
    drawn = {sample_row(logits, SamplingParams(temperature=3e38, top_p=1e-300), s, 0)
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
