"""Prefix caching end to end on tiny models: greedy outputs identical with caching on and
off and to mlx-lm's generation, exact hit counts, eviction under a tiny pool, n > 1 forks."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

BS = 8
SYSTEM = "You are a careful annotator. Answer briefly. "   # 45 tokens: 5 full blocks + 5
CASES = {
    "identical": [SYSTEM + "Q: one", SYSTEM + "Q: one", SYSTEM + "Q: one"],
    "prefix-of-another": [SYSTEM, SYSTEM + "Q: and then some more text"],
    "block-multiple": ["a" * 8 * 4, "a" * 8 * 4 + "b" * 8, "a" * 8 * 4],
    "last-token-differs": [SYSTEM + "Q: cat", SYSTEM + "Q: car", SYSTEM + "Q: cab"],
    "shared-system": [SYSTEM + f"Q: item {i} please" for i in range(6)],
}
MAX_TOKENS = 10


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(eos_id=-1)


def mlx_lm_greedy(model, ids, n):
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def run(model, tok, prompts, params=None, **config):
    cfg = dict(block_size=BS, num_blocks=96, max_num_seqs=4, max_num_batched_tokens=64)
    eng = LLMEngine(EngineConfig(**{**cfg, **config}), model, tok)
    params = params or SamplingParams(max_tokens=MAX_TOKENS)
    outs = list(eng.generate(EngineRequest(str(i), tok.encode(p), params)
                             for i, p in enumerate(prompts)))
    eng.kv_cache_manager.check_invariants([])
    return eng, outs


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_identical_on_off_and_to_mlx_lm(model, tok, case):
    prompts = CASES[case]
    refs = [mlx_lm_greedy(model, tok.encode(p), MAX_TOKENS) for p in prompts]
    on, outs_on = run(model, tok, prompts)
    off, outs_off = run(model, tok, prompts, enable_prefix_caching=False)
    by_id = lambda outs: [o.token_ids for o in sorted(outs, key=lambda o: int(o.request_id))]  # noqa
    assert by_id(outs_on) == refs
    assert by_id(outs_off) == refs
    assert off.counters.cached_prompt_tokens == 0
    assert on.counters.cached_prompt_tokens > 0


def test_exact_hit_counts(model, tok):
    """Hits count whole blocks, capped at len(prompt) - 1; a prompt waits for a shared prefix
    that another request is prefilling instead of computing it twice."""
    prompts = CASES["identical"]  # 51 tokens: 6 full blocks
    _, outs = run(model, tok, prompts)
    cached = sorted(o.num_cached_tokens for o in outs)
    assert cached == [0, 48, 48]
    prompts = CASES["block-multiple"]  # 32, 40, 32 tokens
    _, outs = run(model, tok, prompts)
    by = {int(o.request_id): o.num_cached_tokens for o in outs}
    # Prompt 2 (32 tokens, all cached) may reuse only 3 blocks: the last token is computed.
    assert by == {0: 0, 1: 32, 2: 24}


def test_eviction_under_tiny_pool_keeps_outputs(model, tok):
    prompts = [f"{c * 20} tail {i}" for i, c in enumerate("abcdefgh")] + CASES["shared-system"]
    refs = [mlx_lm_greedy(model, tok.encode(p), MAX_TOKENS) for p in prompts]
    eng, outs = run(model, tok, prompts, num_blocks=24, max_num_seqs=2)
    assert [o.token_ids for o in sorted(outs, key=lambda o: int(o.request_id))] == refs
    assert eng.kv_cache_manager.evicted_blocks > 0


def test_n_samples_fork_and_copy_on_write(model, tok):
    prompt = SYSTEM + "Q: fork"                      # 51 tokens: the last block is partial
    ref = mlx_lm_greedy(model, tok.encode(prompt), MAX_TOKENS)
    eng, outs = run(model, tok, [prompt], SamplingParams(max_tokens=MAX_TOKENS, n=3))
    assert sorted(o.sample_index for o in outs) == [0, 1, 2]
    assert all(o.token_ids == ref for o in outs)
    # Seeded sampling: three different samples, the same three on a second run.
    p = SamplingParams(max_tokens=MAX_TOKENS, n=3, temperature=1.0, seed=11)
    _, a = run(model, tok, [prompt], p)
    _, b = run(model, tok, [prompt], p)
    texts = lambda outs: [o.token_ids for o in sorted(outs, key=lambda o: o.sample_index)]  # noqa
    assert texts(a) == texts(b)
    assert len({tuple(t) for t in texts(a)}) == 3


def test_fork_copies_the_shared_partial_block(model, tok):
    """The children share the prompt blocks; the last, partial one is copied before each
    holder's first write while it is still shared (parent and first child copy; the last
    holder keeps the original), the full ones stay shared."""
    from mlxpa.core.block_pool import NULL_BLOCK
    from mlxpa.request import Request

    eng = LLMEngine(EngineConfig(block_size=BS, num_blocks=64), model, tok)
    ids = tok.encode(SYSTEM + "Q: fork")             # 51 tokens: 6 full blocks + 3 tokens
    eng.add_request("0", ids, SamplingParams(max_tokens=4, n=3))
    eng.step()                                       # prefill of sample 0, then the fork
    running = eng.scheduler.running
    assert len(running) == 3
    parent, children = running[0], running[1:]
    pool = eng.kv_cache_manager.pool
    groups = range(len(parent.block_tables))  # every KV cache group alike
    # a window group's child holds its window's blocks only; where both hold one, the same
    assert all(isinstance(c, Request) and all(
        NULL_BLOCK in (a, b) or a == b for a, b in zip(c.block_tables[g],
                                                      parent.block_tables[g][:7]))
               and c.block_tables[g][6] == parent.block_tables[g][6]
               for c in children for g in groups)
    shared = [parent.block_tables[g][6] for g in groups]
    assert all(pool.ref_cnt(b) == 3 for b in shared)
    out = eng.scheduler.schedule()
    pairs = out.blocks_to_copy
    assert sorted(src for src, _ in pairs) == sorted(shared * 2)
    for g, b in zip(groups, shared):
        assert [dst for src, dst in pairs if src == b] == [parent.block_tables[g][6],
                                                          children[0].block_tables[g][6]]
        assert children[1].block_tables[g][6] == b and pool.ref_cnt(b) == 1
        assert len({r.block_tables[g][6] for r in running}) == 3
        assert all(NULL_BLOCK in (a, b) or a == b for c in children
                   for a, b in zip(c.block_tables[g][:6], parent.block_tables[g][:6]))
