"""Engine against mlx-lm: greedy token ids identical to ``mlx_lm``'s own generation on tiny
random-weight llama and gemma3_text models, with chunked prefill and preemption forced."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

PROMPTS = [
    "hello world, this is a test",
    "a",
    "abcdefghijklmnop",              # 16 tokens: exactly one block of 16, two of 8
    "The quick brown fox jumps over the lazy dog. " * 3,
    "0123456789abcde",               # 15 tokens: block size - 1
    "short prompt",
]
MAX_TOKENS = 12


def mlx_lm_greedy(model, ids: list[int], n: int) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model_and_refs(request):
    model = tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)
    tok = byte_tokenizer(eos_id=-1)  # no EOS: every request runs max_tokens
    ids = [tok.encode(p) for p in PROMPTS]
    refs = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in ids]
    return model, tok, ids, refs


def tiny_pool(model, num_blocks: int, gemma3_blocks: int) -> int:
    """A tiny pool's blocks: ``num_blocks`` for the llama, whose blocks hold both layers;
    ``gemma3_blocks`` for the gemma3_text, whose 3 KV cache groups (one full-attention, two
    sliding-window) take a block of one layer each per position, the window groups at most
    2 blocks of 8 a request (the pool that holds as many tokens, or still preempts)."""
    return gemma3_blocks if model.model_type == "gemma3_text" else num_blocks


def run_engine(model, tok, ids, config, params=None):
    eng = LLMEngine(config, model, tok)
    params = params or SamplingParams(max_tokens=MAX_TOKENS)
    outs = {int(o.request_id): o for o in eng.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    assert sorted(outs) == list(range(len(ids)))
    eng.kv_cache_manager.check_invariants([])
    return eng, outs


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=16, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),   # chunked prefill
    EngineConfig(block_size=8, num_blocks=64, max_num_seqs=2),             # admission cap
    EngineConfig(block_size=8, num_blocks=20, max_num_batched_tokens=32),  # preemption
], ids=["plain", "chunked", "max-seqs", "preempt"])
def test_greedy_matches_mlx_lm(model_and_refs, config):
    model, tok, ids, refs = model_and_refs
    if config.num_blocks == 20:
        config = replace(config, num_blocks=tiny_pool(model, 20, 30))
    eng, outs = run_engine(model, tok, ids, config)
    for i, ref in enumerate(refs):
        assert outs[i].token_ids == ref, f"prompt {i}"
        assert outs[i].finish_reason == "length"
        assert outs[i].text == tok.decode(ref)
    if config.max_num_batched_tokens == 32:
        assert eng.counters.num_preemptions > 0
    assert eng.counters.generation_tokens == MAX_TOKENS * len(ids)


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=16, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),
], ids=["plain", "chunked"])
@pytest.mark.parametrize("numpy_min_keys", [0, 1 << 30], ids=["numpy", "mlx-ops"])
def test_greedy_matches_mlx_lm_with_small_tiles_and_row_splits(model_and_refs, config,
                                                               numpy_min_keys, monkeypatch):
    """Query tiles of 4 rows, MLPs split from 2 rows on and the prefill attention in numpy or
    in MLX ops (the real sizes only act on prompts longer than these tiny ones) keep greedy
    output identical to mlx-lm."""
    from mlxpa.kernels import cpu_paged_attention, cpu_streams

    monkeypatch.setattr(cpu_paged_attention, "QUERY_TILE", 4)
    monkeypatch.setattr(cpu_paged_attention, "NUMPY_MIN_KEYS", numpy_min_keys)
    monkeypatch.setattr(cpu_streams, "MIN_SPLIT_ROWS", 2)
    model, tok, ids, refs = model_and_refs
    _, outs = run_engine(model, tok, ids, config)
    assert [outs[i].token_ids for i in range(len(ids))] == refs


def test_greedy_window_longer_than_prompt_layers(model_and_refs):
    """Contexts far beyond the sliding window (8) still match (window tables trimmed)."""
    model, tok, _, _ = model_and_refs
    ids = [tok.encode("x" * 70 + "yz"), tok.encode("pq" * 20)]
    refs = [mlx_lm_greedy(model, p, 30) for p in ids]
    _, outs = run_engine(model, tok, ids, EngineConfig(block_size=8, num_blocks=64),
                         SamplingParams(max_tokens=30))
    assert [outs[0].token_ids, outs[1].token_ids] == refs


def test_eos_and_stop_strings(model_and_refs):
    model, _, _, _ = model_and_refs
    free = byte_tokenizer(eos_id=-1)
    ids = free.encode(PROMPTS[0])
    ref = mlx_lm_greedy(model, ids, MAX_TOKENS)
    # EOS: make the 4th greedy token the EOS id.
    tok = byte_tokenizer(eos_id=ref[3])
    first = ref.index(ref[3])
    _, outs = run_engine(model, tok, [ids], EngineConfig(num_blocks=32))
    assert outs[0].finish_reason == "stop"
    assert outs[0].token_ids == ref[:first + 1]
    assert outs[0].text == free.decode(ref[:first])
    # Stop string spanning tokens 2..4: the text ends right before it.
    full = free.decode(ref)
    stop = full[2:5]
    _, outs = run_engine(model, free, [ids], EngineConfig(num_blocks=32),
                         SamplingParams(max_tokens=MAX_TOKENS, stop=(stop, "never")))
    assert outs[0].finish_reason == "stop"
    assert outs[0].text == full[:full.index(stop)]


def test_max_tokens_zero_and_errors(model_and_refs):
    model, tok, ids, _ = model_and_refs
    # a pool of 32 tokens
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=tiny_pool(model, 5, 9)), model, tok)
    items = [EngineRequest("0", ids[0], SamplingParams(max_tokens=0)),
             EngineRequest("1", [], SamplingParams()),
             EngineRequest("2", tok.encode("y" * 40), SamplingParams()),
             EngineRequest("3", ids[1], SamplingParams(max_tokens=100))]
    outs = {int(o.request_id): o for o in eng.generate(items)}
    assert outs[0].finish_reason == "length" and outs[0].token_ids == [] and outs[0].text == ""
    assert outs[1].error and "empty" in outs[1].error
    assert outs[2].error and "prompt has 40 tokens; the limit is 31" in outs[2].error
    # Clamped to the pool: 32 tokens minus the prompt.
    assert outs[3].finish_reason == "length" and len(outs[3].token_ids) == 32 - len(ids[1])


def test_seeded_sampling_independent_of_batch(model_and_refs):
    model, tok, ids, _ = model_and_refs
    p = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.95, top_k=50, seed=7)
    _, alone = run_engine(model, tok, [ids[0]], EngineConfig(num_blocks=64), p)
    _, mixed = run_engine(model, tok, ids, EngineConfig(num_blocks=64, max_num_seqs=3), p)
    assert alone[0].token_ids == mixed[0].token_ids
    other = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.95, top_k=50, seed=8)
    _, diff = run_engine(model, tok, [ids[0]], EngineConfig(num_blocks=64), other)
    assert diff[0].token_ids != alone[0].token_ids


def test_stop_edge_cases(model_and_refs):
    """Earliest of several stop strings (one a prefix of another), include_stop_str_in_output,
    stop_token_ids, min_tokens masking EOS, ignore_eos."""
    model, _, _, _ = model_and_refs
    free = byte_tokenizer(eos_id=-1)
    ids = free.encode(PROMPTS[3])
    ref = mlx_lm_greedy(model, ids, MAX_TOKENS)
    full = free.decode(ref)

    def one(params, tok=free):
        _, outs = run_engine(model, tok, [ids], EngineConfig(num_blocks=32), params)
        return outs[0]

    a, b = full[3:6], full[3:5]               # b is a prefix of a: the earliest match wins
    out = one(SamplingParams(max_tokens=MAX_TOKENS, stop=(a, b)))
    assert out.text == full[:3] and out.finish_reason == "stop"
    out = one(SamplingParams(max_tokens=MAX_TOKENS, stop=(a,), include_stop_str_in_output=True))
    assert out.text == full[:6]
    out = one(SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(ref[4],)))
    k = ref.index(ref[4])
    assert out.token_ids == ref[:k + 1] and out.text == free.decode(ref[:k])
    # min_tokens: EOS (the greedy first token here) is masked until 3 tokens exist.
    eos_tok = byte_tokenizer(eos_id=ref[0])
    out = one(SamplingParams(max_tokens=MAX_TOKENS, min_tokens=3), eos_tok)
    assert len(out.token_ids) >= 3 and ref[0] not in out.token_ids[:3]
    out = one(SamplingParams(max_tokens=MAX_TOKENS), eos_tok)
    assert out.token_ids == [ref[0]] and out.finish_reason == "stop"
    out = one(SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), eos_tok)
    assert out.token_ids == ref and out.finish_reason == "length"


def test_min_tokens_above_max_tokens_is_rejected():
    import pytest

    from mlxpa.sampling_params import SamplingParams

    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=5)
    assert SamplingParams(max_tokens=5, min_tokens=5).min_tokens == 5
