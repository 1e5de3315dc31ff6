"""``n`` > 1 on tiny models: samples stay within ``max_num_seqs`` (children beyond the free
slots wait and read the prompt from the prefix cache) and every sample's output equals the
same run without the limit; greedy samples equal mlx-lm's greedy generation."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_llama

BS = 8
PROMPT = "You are a careful annotator. Q: fork"  # 36 tokens: 4 full blocks + 4
N = 12


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(eos_id=-1)


def run(model, tok, params: SamplingParams, max_num_seqs: int, **config):
    """All samples' token ids by sample index, and the most sequences run at once."""
    eng = LLMEngine(EngineConfig(block_size=BS, num_blocks=96, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=64, **config), model, tok)
    assert eng.add_request("0", tok.encode(PROMPT), params) is None
    outs, most = [], 0
    while eng.has_unfinished_requests():
        outs.extend(eng.step())
        most = max(most, len(eng.scheduler.running))
    eng.kv_cache_manager.check_invariants([])
    assert eng.kv_cache_manager.num_active_blocks == 0
    return [o.token_ids for o in sorted(outs, key=lambda o: o.sample_index)], most


@pytest.mark.parametrize("caching", [True, False])
def test_small_max_num_seqs_holds_and_keeps_outputs(model, tok, caching):
    sampled = SamplingParams(max_tokens=6, n=N, temperature=1.0)
    wide, most_wide = run(model, tok, sampled, 16, enable_prefix_caching=caching)
    narrow, most_narrow = run(model, tok, sampled, 3, enable_prefix_caching=caching)
    assert most_wide == N and most_narrow == 3
    assert len(narrow) == N and narrow == wide
    assert len({tuple(t) for t in narrow}) > 1  # the samples differ from one another
    greedy = SamplingParams(max_tokens=6, n=N)
    ref = [int(t) for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=6)]
    narrow, most_narrow = run(model, tok, greedy, 3, enable_prefix_caching=caching)
    assert most_narrow == 3 and narrow == [ref] * N
