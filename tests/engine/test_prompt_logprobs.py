"""vLLM's ``prompt_logprobs`` through the engine against a float64 log-softmax of mlx-lm's own
forward pass over the prompt: every prompt token after the first, with its rank and its most
likely alternatives, in one prefill, in chunks, after another row cached the whole prompt,
for ``n > 1`` samples (computed once), and with the LM head applied in bounded slices."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import logprobs as logprobs_module
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama
from tests.tiny_models import float64_log_softmax as oracle

PROMPT = "The quick brown fox jumps over the lazy dog"
TOP = 4


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)



def check(model, ids: list[int], got, top: int = TOP) -> None:
    ref = oracle(model, ids)
    assert len(got) == len(ids) and got[0] is None
    for p in range(1, len(ids)):
        row, lp = ref[p - 1], got[p]
        assert lp.token_id == ids[p]
        assert abs(lp.logprob - row[ids[p]]) < 1e-4, p
        assert lp.rank == int((row >= row[ids[p]] - 1e-6).sum()), p
        assert [t for t, _ in lp.top] == np.argsort(-row)[:top].tolist(), p
        for t, v in lp.top:
            assert abs(v - row[t]) < 1e-4, (p, t)


def run(model, config: EngineConfig, inputs: list[EngineRequest]):
    eng = LLMEngine(config, model, byte_tokenizer(eos_id=-1))
    outs = {}
    for o in eng.generate(inputs):
        outs[(o.request_id, o.sample_index)] = o
    return eng, outs


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=8, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),
], ids=["one-prefill", "chunked"])
def test_prompt_logprobs_match_mlx_lm(model, config):
    ids = byte_tokenizer().encode(PROMPT)
    sp = SamplingParams(max_tokens=3, prompt_logprobs=TOP)
    _, outs = run(model, config, [EngineRequest("a", ids, sp),
                                  EngineRequest("b", ids[:9], SamplingParams(max_tokens=2))])
    check(model, ids, outs[("a", 0)].prompt_logprobs)
    assert outs[("b", 0)].prompt_logprobs is None


def test_exact_after_the_cache_holds_the_prompt(model):
    """A row caches the prompt's full blocks first; the row that asks for prompt logprobs
    hits none of them (every position's logits are needed) and its values are exact; a
    later plain row of the same prompt still hits the cache."""
    ids = byte_tokenizer().encode(PROMPT)
    config = EngineConfig(block_size=8, num_blocks=64, max_num_seqs=1)
    _, outs = run(model, config, [
        EngineRequest("warm", ids, SamplingParams(max_tokens=1)),
        EngineRequest("scored", ids, SamplingParams(max_tokens=1, prompt_logprobs=0)),
        EngineRequest("plain", ids, SamplingParams(max_tokens=1))])
    assert outs[("scored", 0)].num_cached_tokens == 0
    assert outs[("plain", 0)].num_cached_tokens == 40
    check(model, ids, outs[("scored", 0)].prompt_logprobs, top=0)


def test_n_samples_share_one_computation(model):
    ids = byte_tokenizer().encode(PROMPT)
    eng, outs = run(model, EngineConfig(block_size=8, num_blocks=64), [EngineRequest(
        "n", ids, SamplingParams(max_tokens=4, n=3, temperature=1.0, prompt_logprobs=2))])
    assert eng.counters.scored_tokens == len(ids) - 1  # once, not once per sample
    first = outs[("n", 0)].prompt_logprobs
    check(model, ids, first, top=2)
    assert outs[("n", 1)].prompt_logprobs == first == outs[("n", 2)].prompt_logprobs


def test_the_head_runs_in_bounded_slices(monkeypatch):
    """A 256-token prompt scored over a 32,768-token vocabulary: its logits at once take
    32 MiB (float32), and the log-softmax and top-k as much again; with slices of 1 MiB
    (8 positions) the step's peak memory drops by more than 32 MiB and the values stay."""
    model = tiny_llama(vocab=1 << 15)
    ids = [(7 * i * i + 3 * i) % 30000 + 3 for i in range(256)]
    config = EngineConfig(block_size=16, num_blocks=64)
    sp = SamplingParams(max_tokens=1, prompt_logprobs=3)

    def peak(slice_bytes: int):
        monkeypatch.setattr(logprobs_module, "SCORE_SLICE_BYTES", slice_bytes)
        eng = LLMEngine(config, model, byte_tokenizer(eos_id=-1))
        mx.synchronize()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        (out,) = eng.generate([EngineRequest("0", ids, sp)])
        return mx.get_peak_memory() - base, out.prompt_logprobs

    whole, a = peak(1 << 30)
    sliced, b = peak(1 << 20)
    assert whole - sliced > 32 * 2**20, (whole / 2**20, sliced / 2**20)
    assert [x.token_id for x in a[1:]] == [x.token_id for x in b[1:]] == ids[1:]
    assert max(abs(x.logprob - y.logprob) for x, y in zip(a[1:], b[1:])) < 1e-5
    assert [x.top for x in a[1:5]] == [y.top for y in b[1:5]]
