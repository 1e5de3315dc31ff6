"""Seeded sampled rows through the engine: the same tokens alone, beside other rows, and with
preemption forced (their KV recomputed), whichever way the batched sampler decides each row
(on candidates from block maxima, or over the whole vocabulary).

Oracle: the row run alone in an engine of its own; a different seed must draw differently."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import topk_topp_sampler
from tests.tiny_models import byte_tokenizer, tiny_llama

PROMPTS = ["hello world, this is a test", "a", "abcdefghijklmnop",
           "The quick brown fox jumps over the lazy dog. " * 3, "0123456789abcde",
           "short prompt"]
FILTERS = {
    "top_k": dict(temperature=0.8, top_k=20),
    "top_k_top_p": dict(temperature=0.8, top_p=0.9, top_k=50),
    "top_p": dict(temperature=1.5, top_p=0.95),
    "min_p": dict(temperature=1.0, min_p=0.02),
    "plain": dict(temperature=1.0),
}


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(), byte_tokenizer(eos_id=-1)


def _run(model, tok, prompts, params, config) -> tuple[dict[int, list[int]], int]:
    eng = LLMEngine(config, model, tok)
    outs = {int(o.request_id): o.token_ids for o in eng.generate(
        EngineRequest(str(i), tok.encode(p), params[i]) for i, p in enumerate(prompts))}
    eng.kv_cache_manager.check_invariants([])
    return outs, eng.counters.num_preemptions


@pytest.mark.parametrize("block", [256, 2], ids=["whole-rows", "candidates"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_seeded_rows_alone_batched_and_preempted(tiny, monkeypatch, name, block):
    model, tok = tiny
    # the tiny vocabulary (256) is one block of the default size: smaller blocks make the
    # sampler decide rows on candidates
    monkeypatch.setattr(topk_topp_sampler.draw, "__defaults__",
                        (block, topk_topp_sampler.NUM_CANDIDATES))
    params = [SamplingParams(max_tokens=12, seed=100 + i, **FILTERS[name])
              for i in range(len(PROMPTS))]
    params[1] = SamplingParams(max_tokens=12)  # a greedy neighbour
    params[4] = SamplingParams(max_tokens=12, temperature=0.7, top_k=5, seed=3)
    alone = {i: _run(model, tok, [PROMPTS[i]], [params[i]], EngineConfig(num_blocks=64))[0][0]
             for i in (0, 3)}
    batched, _ = _run(model, tok, PROMPTS, params, EngineConfig(num_blocks=64, max_num_seqs=3))
    preempted, count = _run(model, tok, PROMPTS, params, EngineConfig(
        block_size=8, num_blocks=20, max_num_batched_tokens=32))
    assert count > 0
    for i in (0, 3):
        assert batched[i] == alone[i], (i, name)
    for i, tokens in preempted.items():  # the pool may cut a long row short there
        assert tokens and tokens == batched[i][:len(tokens)], (i, name)
    other = [SamplingParams(max_tokens=12, seed=999, **FILTERS[name])]
    assert _run(model, tok, [PROMPTS[0]], other, EngineConfig(num_blocks=64))[0][0] != alone[0]
