"""Sliding-window layers keep only their window: Gemma 3's layout at toy size (6 layers, an
8-token window on 4 of them: a full-attention group and two window groups of 2 layers each,
2 layer slots a block) against mlx-lm's own generation. Greedy ids identical for prompts many
windows long with chunked prefill and preemption, after prefix hits (the window before the hit
read from the tree), with the tree's window blocks evicted, and for forked samples; log
probabilities after a hit equal a float64 oracle; the window groups hold at most their
window's blocks while a request runs, and nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import NULL_BLOCK
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.engine.test_llm_engine import mlx_lm_greedy
from tests.tiny_models import byte_tokenizer, float64_log_softmax, tiny_gemma3

W = 8
DOC = ("A sliding window keeps the last few tokens only; a long document needs its "
       "full-attention layers for the rest. ")  # 111 tokens with BOS
PROMPTS = [DOC + "Summary:", DOC * 2 + "Question: what?", "short one", DOC[:40] + "end"]
OUT = 10


@pytest.fixture(scope="module")
def model_and_refs():
    model = tiny_gemma3(sliding_window=W, num_layers=6)
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, OUT) for p in ids]


def _run(model, tok, items, config):
    eng = LLMEngine(config, model, tok)
    outs = {o.request_id: o for o in eng.generate(EngineRequest(*it) for it in items)}
    return eng, outs


def _shared(a: list[int], b: list[int]) -> int:
    """Tokens of ``b`` a hit on ``a`` covers: their common prefix in whole blocks of 4."""
    n = 0
    while n < min(len(a), len(b) - 1) and a[n] == b[n]:
        n += 1
    return n // 4 * 4


def _clean(eng: LLMEngine) -> None:
    if eng.scheduler.has_finished_requests():
        eng.step()
    kv = eng.kv_cache_manager
    kv.check_invariants([])
    assert kv.num_active_blocks == 0
    if kv.tree is not None:
        kv.tree.evict(kv.pool.num_usable_blocks)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


def test_the_layout_is_one_full_group_and_two_window_groups(model_and_refs):
    model, tok, _, _ = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=64), model, tok)
    layout = eng.runner.kv_cache_layout
    assert layout.windows == [None, W, W] and layout.num_slots == 2
    assert [g.entries for g in layout.groups] == [(2, 5), (0, 1), (3, 4)]
    assert layout.max_chunk_tokens == 256  # the window, at least 256 tokens


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=4, num_blocks=400),
    EngineConfig(block_size=4, num_blocks=400, max_num_batched_tokens=7),  # chunked prefill
    EngineConfig(block_size=4, num_blocks=70, max_num_batched_tokens=64),  # preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_mlx_lm(model_and_refs, config):
    model, tok, ids, refs = model_and_refs
    eng, outs = _run(model, tok, [(str(i), p, SamplingParams(max_tokens=OUT))
                                  for i, p in enumerate(ids)], config)
    for i, ref in enumerate(refs):
        assert outs[str(i)].token_ids == ref, i
    if config.num_blocks == 70:
        assert eng.counters.num_preemptions > 0
    _clean(eng)


def test_window_groups_hold_only_their_window(model_and_refs):
    """One long request, 16-token chunks: after every step each window group's table is
    the null block before its window and holds at most ``ceil((W - 1 + 16) / 4) + 1``
    blocks; the pool holds exactly the request's blocks (no prefix cache)."""
    model, tok, ids, refs = model_and_refs
    config = EngineConfig(block_size=4, num_blocks=200, max_num_batched_tokens=16,
                          enable_prefix_caching=False)
    eng = LLMEngine(config, model, tok)
    eng.add_request("r", ids[1], SamplingParams(max_tokens=OUT))
    kv, outs = eng.kv_cache_manager, []
    while eng.has_unfinished_requests():
        outs += eng.step()
        for req in eng.scheduler.running:
            first = max(0, req.num_computed_tokens - W + 1) // 4
            live = 0
            for g in (1, 2):
                table = req.block_tables[g]
                assert all(b == NULL_BLOCK for b in table[:first])
                assert NULL_BLOCK not in table[first:]
                live += len(table) - first
                assert len(table) - first <= kv.layout.window_blocks(W, 16)
            full = len(req.block_tables[0])
            assert kv.num_used_blocks == full + live
            assert kv.active_blocks_by_group()[:3] == [full, *(
                len(req.block_tables[g]) - first for g in (1, 2))]
    assert outs[-1].token_ids == refs[1]
    assert eng.counters.peak_kv_bytes_by_group["sliding_window_8"] <= (
        2 * kv.layout.window_blocks(W, 16) * eng.runner.block_bytes)
    _clean(eng)


def test_a_hit_reads_the_window_from_the_tree(model_and_refs):
    """B shares A's first 111 tokens: it resumes after 108 of them (whole blocks) with the
    full-attention blocks of all 108 and the window groups' last blocks before them; its
    ids and each generated token's log-probability equal the oracle's."""
    model, tok, _, _ = model_and_refs
    a, b = tok.encode(DOC + "Alpha question"), tok.encode(DOC + "Beta question here")
    config = EngineConfig(block_size=4, num_blocks=400)
    eng = LLMEngine(config, model, tok)
    (out_a,) = eng.generate([EngineRequest("a", a, SamplingParams(max_tokens=OUT))])
    (out_b,) = eng.generate([EngineRequest("b", b, SamplingParams(max_tokens=OUT, logprobs=1))])
    assert out_a.num_cached_tokens == 0 and out_b.num_cached_tokens == _shared(a, b) == 108
    assert out_a.token_ids == mlx_lm_greedy(model, a, OUT)
    assert out_b.token_ids == mlx_lm_greedy(model, b, OUT)
    ref = float64_log_softmax(model, b + out_b.token_ids)
    for k, lp in enumerate(out_b.logprobs):
        assert abs(lp.logprob - ref[len(b) - 1 + k][lp.token_id]) < 1e-3
    _clean(eng)


def test_evicted_windows_recompute_and_heal(model_and_refs):
    """Evict most of what A left in the tree (its window blocks first, then its tail): B
    resumes from whatever is still usable and is still exact; B's own blocks fill the
    tree's tombstones, so C hits the whole shared prefix again."""
    model, tok, _, _ = model_and_refs
    prompts = [tok.encode(DOC + s) for s in ("one", "two two", "three")]
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=400), model, tok)
    kv, cached = eng.kv_cache_manager, []
    for i, p in enumerate(prompts):
        (out,) = eng.generate([EngineRequest(str(i), p, SamplingParams(max_tokens=OUT))])
        assert out.token_ids == mlx_lm_greedy(model, p, OUT), i
        cached.append(out.num_cached_tokens)
        if i == 0:
            kv.tree.evict(kv.tree.total_blocks * 2 // 3)
            kv.check_invariants([])
    assert cached[1] < _shared(prompts[0], prompts[1])
    assert cached[2] == _shared(prompts[1], prompts[2]) == 112
    _clean(eng)


def test_forked_samples_share_the_window(model_and_refs):
    model, tok, ids, refs = model_and_refs
    for chunk in (2048, 9):
        eng, outs = _run(model, tok, [("p", ids[0], SamplingParams(max_tokens=OUT, n=3))],
                         EngineConfig(block_size=4, num_blocks=400,
                                      max_num_batched_tokens=chunk))
        assert outs["p"].token_ids == refs[0]
        _clean(eng)
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=400), model, tok)
    got = sorted((o.sample_index, o.token_ids) for o in eng.generate(
        [EngineRequest("p", ids[0], SamplingParams(max_tokens=OUT, n=3))]))
    assert [t for _, t in got] == [refs[0]] * 3
    _clean(eng)


def test_abort_frees_every_window_block(model_and_refs):
    model, tok, ids, _ = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=400, max_num_batched_tokens=24),
                    model, tok)
    for i, p in enumerate(ids):
        eng.add_request(str(i), p, SamplingParams(max_tokens=OUT, n=2))
    for _ in range(5):
        eng.step()
    eng.abort_unfinished()
    _clean(eng)
    assert np.isfinite(eng.counters.peak_kv_bytes) and eng.counters.peak_kv_bytes > 0


def _chunks(eng: LLMEngine) -> list[list[int]]:
    """Record the tokens every step schedules per request (``num_scheduled_tokens``)."""
    schedule, seen = eng.scheduler.schedule, []

    def spy():
        out = schedule()
        seen.append(list(out.num_scheduled_tokens))
        return out

    eng.scheduler.schedule = spy
    return seen


@pytest.mark.parametrize(("num_blocks", "prefill"), [
    (600, [555]),            # room to spare: the whole prompt in one chunk
    (300, [300, 255]),       # 23 spare blocks: 11 more blocks of tokens past the cap
    (277, [256, 256, 43]),   # no spare block: the cap
])
def test_a_long_prefill_goes_past_the_window_cap_only_into_spare_blocks(
        model_and_refs, num_blocks, prefill):
    """The toy layout caps a prefill chunk at 256 tokens. A 555-token prompt (10 out) needs
    142 full-attention blocks and, at the cap, 67 in each window group (276; the null block
    takes one of the pool's): a chunk goes past the cap by one block of tokens for every 2
    blocks (one per window group) free beyond that; greedy ids equal mlx-lm's, nothing
    leaks."""
    model, tok, _, _ = model_and_refs
    ids = tok.encode(DOC * 5)
    assert len(ids) == 555
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=num_blocks,
                                 max_num_batched_tokens=2048), model, tok)
    seen = _chunks(eng)
    (out,) = eng.generate([EngineRequest("r", ids, SamplingParams(max_tokens=OUT))])
    assert [c[0] for c in seen if c][:len(prefill)] == prefill
    assert out.token_ids == mlx_lm_greedy(model, ids, OUT)
    assert eng.counters.num_preemptions == 0
    _clean(eng)


def test_a_long_chunk_leaves_room_for_the_running_requests(model_and_refs):
    """A short request decodes beside a long prompt in a pool that holds both at the cap with
    8 blocks to spare: the long prompt's first chunk takes 4 blocks of tokens past the cap
    (2 window groups); its second takes the rest of the prompt (283 tokens, 27 past the
    cap), since the window blocks the first chunk left behind stay cached and count as
    available (evicted LRU, as vLLM's free queue hands out cached free blocks); nobody is
    preempted, and both equal mlx-lm's greedy ids."""
    model, tok, _, _ = model_and_refs
    short, long = tok.encode("short one"), tok.encode(DOC * 5)
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=330, max_num_batched_tokens=2048),
                    model, tok)
    seen = _chunks(eng)
    outs = {o.request_id: o for o in eng.generate([
        EngineRequest("s", short, SamplingParams(max_tokens=50)),
        EngineRequest("l", long, SamplingParams(max_tokens=OUT))])}
    assert seen[0] == [len(short), 272] and seen[1] == [1, 555 - 272]
    assert eng.counters.num_preemptions == 0
    assert outs["s"].token_ids == mlx_lm_greedy(model, short, 50)
    assert outs["l"].token_ids == mlx_lm_greedy(model, long, OUT)
    _clean(eng)
