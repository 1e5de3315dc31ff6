"""Hybrid and state-space models (recurrent state per request beside the paged KV pools)
against mlx-lm's own ``generate_step``: greedy ids identical with chunked prefill (the state
carried across chunks), preemption (the state recomputed from position 0) and ``n > 1``
samples (each its own request); prefix caching is off for them."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.engine.test_llm_engine import MAX_TOKENS, PROMPTS, mlx_lm_greedy, run_engine
from tests.loader.tiny_archs import build
from tests.tiny_models import byte_tokenizer


@pytest.fixture(scope="module", params=["qwen3_next", "lfm2", "mamba2"])
def model_and_refs(request):
    model = build(request.param)
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, MAX_TOKENS) for p in ids]


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=8, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),   # chunked prefill
    EngineConfig(block_size=8, num_blocks=20, max_num_batched_tokens=32),  # preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_mlx_lm(model_and_refs, config):
    model, tok, ids, refs = model_and_refs
    eng, outs = run_engine(model, tok, ids, config)
    assert eng.runner.states is not None
    assert not eng.kv_cache_manager.enable_prefix_caching
    for i, ref in enumerate(refs):
        assert outs[i].token_ids == ref, f"prompt {i}"
    if config.num_blocks == 20 and eng.runner.geometry.has_kv:
        assert eng.counters.num_preemptions > 0
    assert not eng.runner.states.keys()  # every finished request's state dropped


def test_samples_are_requests_of_their_own(model_and_refs):
    """``n = 3`` greedy samples of one prompt: each equals mlx-lm's greedy continuation."""
    model, tok, ids, refs = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64), model, tok)
    outs = list(eng.generate([EngineRequest("p", ids[0], SamplingParams(max_tokens=MAX_TOKENS,
                                                                        n=3))]))
    assert sorted(o.sample_index for o in outs) == [0, 1, 2]
    assert all(o.token_ids == refs[0] for o in outs)
