"""Log-probabilities against mlx-lm: each generated token's raw log-softmax and top tokens,
and ``choice_logprobs`` as the teacher-forced sum from mlx-lm's own forward pass."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama


def oracle_logprobs(model, ids: list[int]) -> mx.array:
    """``[len(ids), V]`` float32 log-softmax of mlx-lm's own forward pass (no cache)."""
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=8, num_blocks=128),
    EngineConfig(block_size=4, num_blocks=40, max_num_batched_tokens=9),  # chunked, preempted
], ids=["plain", "chunked-preempt"])
def test_token_logprobs_match_mlx_lm(model, config):
    tok = byte_tokenizer()
    prompts = ["hello world, this is a test", "abc", "0123456789abcdefghij" * 2]
    eng = LLMEngine(config, model, tok)
    items = [EngineRequest("0", tok.encode(prompts[0]), SamplingParams(
                 max_tokens=10, logprobs=3, ignore_eos=True)),
             EngineRequest("1", tok.encode(prompts[1]), SamplingParams(
                 max_tokens=10, temperature=0.9, seed=3, logprobs=0, ignore_eos=True,
                 structured_outputs=StructuredOutput.make("regex", "[a-z ]+"))),
             EngineRequest("2", tok.encode(prompts[2]), SamplingParams(max_tokens=10))]
    outs = {int(o.request_id): o for o in eng.generate(items)}
    assert outs[2].logprobs is None
    for i in (0, 1):
        out = outs[i]
        ids = tok.encode(prompts[i]) + out.token_ids
        ref = oracle_logprobs(model, ids)
        p = len(ids) - len(out.token_ids)
        assert len(out.logprobs) == len(out.token_ids)
        for j, lp in enumerate(out.logprobs):
            row = ref[p - 1 + j]
            assert lp.token_id == out.token_ids[j]
            assert abs(lp.logprob - row[lp.token_id].item()) < 1e-4
            want = mx.argsort(-row)[:3].tolist() if i == 0 else []
            assert [t for t, _ in lp.top] == want
            for t, v in lp.top:
                assert abs(v - row[t].item()) < 1e-4


@pytest.mark.parametrize("prompt", ["Review: great phone. Sentiment:",
                                    "a longer prompt that spans several blocks of eight. " * 2])
def test_choice_logprobs_are_teacher_forced_sums(model, prompt):
    tok = byte_tokenizer()
    choices = ["good", "bad!"]
    so = StructuredOutput.make("choice", choices)
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=128), model, tok)
    ids = tok.encode(prompt)
    outs = list(eng.generate([EngineRequest("0", ids, SamplingParams(max_tokens=8,
                                                                 structured_outputs=so)),
                              EngineRequest("1", ids, SamplingParams(max_tokens=8, n=2, seed=1,
                                                                 temperature=1.0,
                                                                 structured_outputs=so))]))
    assert len(outs) == 3
    total = 0.0
    for c in choices:
        cid = tok.encode(c, add_special_tokens=False)
        ref = oracle_logprobs(model, ids + cid)
        want = sum(ref[len(ids) - 1 + j, t].item() for j, t in enumerate(cid))
        for out in outs:
            assert abs(math.exp(out.choice_logprobs[c]) - math.exp(want)) < 1e-4
            assert abs(out.choice_logprobs[c] - want) < 1e-3
        total += math.exp(want)
    assert total <= 1.0
    for out in outs:
        assert out.text in choices and out.finish_reason == "stop"
    if len(ids) > 16:  # the second row hits the first row's cached full blocks
        assert max(o.num_cached_tokens for o in outs) == (len(ids) - 1) // 8 * 8
    assert eng.counters.generation_tokens == sum(len(o.token_ids) for o in outs)
