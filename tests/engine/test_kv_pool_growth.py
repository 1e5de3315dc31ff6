"""A KV pool that grows by segments and is given back when idle, end to end on tiny models.

Oracles: ``mlx_lm``'s own greedy generation and, for every case, the same engine on a pool
preallocated at the same ceiling (identical tokens and, by the scheduler's design, identical
preemptions): a llama, a gemma3_text with sliding-window groups, an int8 pool, cascade
attention over a shared prefix, preemption in a pool at its ceiling, chunked prefill, aborts,
recurrent snapshots (a hybrid and a state-space model);
no block leaked after each run (``check_invariants``); the pool's arrays follow the block
pool's size; a release keeps what fits in one segment and the next run grows again; an
``AsyncLLM`` gives its pool back on its own when idle; the process's RSS (``/proc``) falls when
a pool of a few hundred MiB is given back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.async_llm import AsyncLLM
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import attention, cascade
from tests.engine.test_hybrid import PREFIX, SUFFIXES
from tests.loader.tiny_archs import build
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

PROMPTS = ["hello world, this is a test", "a", "abcdefghijklmnop",
           "The quick brown fox jumps over the lazy dog. " * 3, "0123456789abcde",
           "short prompt"]
MAX_TOKENS = 12
SEGMENT = 3  # blocks: the pool grows many times


def mlx_lm_greedy(model, ids: list[int], n: int) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model_and_refs(request):
    model = tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, MAX_TOKENS) for p in ids]


def block_bytes(model, tok, config: EngineConfig) -> int:
    return LLMEngine(config, model, tok).runner.block_bytes


def run(engine: LLMEngine, ids: list[list[int]], max_tokens: int = MAX_TOKENS,
        ) -> dict[int, list[int]]:
    params = SamplingParams(max_tokens=max_tokens)
    outs = {int(o.request_id): o.token_ids for o in engine.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    check_pool(engine)
    return outs


def check_pool(engine: LLMEngine) -> None:
    """No block leaked; the runner's arrays hold the block pool's blocks."""
    kv = engine.kv_cache_manager
    kv.check_invariants([])
    assert kv.num_active_blocks == 0
    rows = {a.shape[0] for a in engine.runner.kv_cache.arrays()}  # quantized: 3 a pool
    assert rows == {engine.runner.num_blocks} == {kv.pool.num_blocks}


def pair(model, tok, config: EngineConfig) -> tuple[LLMEngine, LLMEngine]:
    """The same engine on a preallocated pool, and on one that grows by :data:`SEGMENT`
    blocks to the same ceiling (``config.num_blocks``)."""
    segment = SEGMENT * block_bytes(model, tok, config)
    return (LLMEngine(config, model, tok),
            LLMEngine(replace(config, kv_segment_bytes=segment), model, tok))


CASES = {
    "plain": EngineConfig(block_size=8, num_blocks=64),
    "chunked": EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),
    "preempt": EngineConfig(block_size=8, num_blocks=20, max_num_batched_tokens=32),
    "int8": EngineConfig(block_size=8, num_blocks=64, kv_cache_dtype="int8"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_growing_pool_gives_the_tokens_of_mlx_lm_and_of_a_preallocated_pool(
        model_and_refs, case):
    model, tok, ids, refs = model_and_refs
    config = CASES[case]
    if case == "preempt" and model.model_type == "gemma3_text":
        config = replace(config, num_blocks=30)  # 3 groups: a block of one layer each
    fixed, growing = pair(model, tok, config)
    assert growing.runner.num_blocks == SEGMENT and fixed.runner.num_blocks == config.num_blocks
    want = run(fixed, ids)
    got = run(growing, ids)
    assert got == want
    if case != "int8":  # a quantized pool is not mlx-lm's float cache (test_kv_quant.py)
        assert got == dict(enumerate(refs))
    assert growing.counters.kv_pool_growths >= (2 if case == "chunked" else 1)
    assert SEGMENT < growing.runner.num_blocks <= config.num_blocks
    assert growing.counters.num_preemptions == fixed.counters.num_preemptions
    if case == "preempt":
        assert growing.counters.num_preemptions > 0


def test_a_released_pool_keeps_what_fits_and_grows_again(model_and_refs):
    model, tok, ids, refs = model_and_refs
    _, engine = pair(model, tok, EngineConfig(block_size=8, num_blocks=64,
                                              kv_release_after=0))
    assert run(engine, ids) == dict(enumerate(refs))
    grown = engine.runner.num_blocks
    assert engine.kv_release_due() == 0.0 and grown > SEGMENT
    assert engine.release_kv_memory()
    check_pool(engine)
    assert engine.runner.num_blocks == SEGMENT and engine.kv_release_due() is None
    assert not engine.release_kv_memory()  # one segment: nothing more to give back
    kept = engine.kv_cache_manager.tree.total_blocks
    assert 0 < kept <= SEGMENT - 1
    assert run(engine, ids) == dict(enumerate(refs))  # the kept blocks hold the right K/V
    assert engine.runner.num_blocks > SEGMENT


def test_aborts_and_a_release_mid_way_leak_nothing(model_and_refs):
    model, tok, ids, refs = model_and_refs
    _, engine = pair(model, tok, EngineConfig(block_size=8, num_blocks=64,
                                              kv_release_after=0))
    params = SamplingParams(max_tokens=MAX_TOKENS)
    for i, p in enumerate(ids):
        engine.add_request(str(i), p, params)
    for _ in range(3):
        engine.step()
    assert not engine.release_kv_memory()  # requests in flight: nothing is given back
    engine.abort_request(["1", "3"])
    outs = {}
    while engine.has_unfinished_requests() or engine.scheduler.has_finished_requests():
        outs.update({int(o.request_id): o.token_ids for o in engine.step()})
    assert outs == {i: refs[i] for i in (0, 2, 4, 5)}
    check_pool(engine)
    assert engine.release_kv_memory()
    check_pool(engine)


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2"])
def test_recurrent_snapshots_move_with_their_blocks(arch):
    """A hybrid model (K/V and recurrent state) and a state-space one (no K/V: snapshots in
    a raw array): rows sharing a prefix resume from its snapshot in a growing pool; after a
    release (snapshots compacted or evicted with their node), the same tokens again."""
    model, tok = build(arch), byte_tokenizer(eos_id=-1)
    ids = [tok.encode(PREFIX + s) for s in SUFFIXES]
    config = EngineConfig(block_size=8, num_blocks=128, kv_release_after=0)
    fixed, growing = pair(model, tok, config)
    want = run(fixed, ids)
    assert run(growing, ids) == want == {i: mlx_lm_greedy(model, p, MAX_TOKENS)
                                         for i, p in enumerate(ids)}
    assert growing.counters.cached_prompt_tokens == fixed.counters.cached_prompt_tokens > 0
    grown = growing.runner.num_blocks > SEGMENT  # mamba2's snapshots fit one segment
    assert grown == (arch == "qwen3_next") == growing.release_kv_memory()
    check_pool(growing)
    assert run(growing, ids) == want


def test_cascade_attention_over_a_growing_pool(monkeypatch):
    """Rows sharing a 4-block prefix decode with cascade attention (every group accepted);
    the pool grows under them: the tokens of the preallocated pool and of mlx-lm."""
    monkeypatch.setattr(cascade, "worth_cascading", lambda rows, blocks: True)
    calls = []
    attend = attention.cascade_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return attend(*args, **kwargs)

    monkeypatch.setattr(attention, "cascade_attention", spy)
    model, tok = tiny_llama(), byte_tokenizer(eos_id=-1)
    doc = tok.encode("The quick brown fox jumps over the lazy dog, twice. ")[:32]
    ids = [doc + tok.encode(q) for q in ("a?", "bc?", "def?", "ghij?", "k", "lm")]
    config = EngineConfig(block_size=8, num_blocks=128, max_num_batched_tokens=256)
    fixed, growing = pair(model, tok, config)
    want = run(fixed, ids)
    calls.clear()
    assert run(growing, ids) == want == {i: mlx_lm_greedy(model, p, MAX_TOKENS)
                                         for i, p in enumerate(ids)}
    assert calls and growing.counters.kv_pool_growths >= 1


def test_an_async_server_engine_gives_its_pool_back_when_idle():
    model, tok = tiny_llama(), byte_tokenizer()
    config = EngineConfig(block_size=8, num_blocks=300, max_num_seqs=8,
                          max_num_batched_tokens=64, kv_release_after=0.3)
    segment = SEGMENT * block_bytes(model, tok, config)
    config = replace(config, kv_segment_bytes=segment)
    llm = AsyncLLM(config, engine_factory=lambda: LLMEngine(config, model, tok)).start()
    requests = [EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=8))
                for i, p in enumerate(PROMPTS)]

    async def texts(request: EngineRequest) -> str:
        return "".join([out.text async for out in llm.generate(request)])

    async def all_of(reqs):
        return await asyncio.gather(*(texts(r) for r in reqs))

    try:
        first = asyncio.run(all_of(requests))
        assert llm.stats.kv_pool_blocks > SEGMENT - 1 and llm.stats.counters.kv_pool_growths
        assert llm.stats.kv_pool_ceiling_bytes == 300 * llm.engine.runner.kv_cache.block_nbytes
        deadline = time.monotonic() + 20
        while llm.stats.kv_pool_blocks > SEGMENT - 1:  # published by the engine thread
            assert time.monotonic() < deadline, llm.stats
            time.sleep(0.02)
        assert llm.stats.counters.kv_pool_releases == 1
        assert llm.stats.kv_pool_bytes == SEGMENT * llm.engine.runner.kv_cache.block_nbytes
        assert asyncio.run(all_of(requests)) == first
    finally:
        llm.shutdown()
    check_pool(llm.engine)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_the_memory_of_a_released_pool_goes_back_to_the_system():
    """A pool grown to 320 MiB, then released to one 16 MiB segment: the process's resident
    memory (RSS, read from /proc: MLX's buffer cache included) rises by most of the pool and
    falls back by most of it."""
    model, tok = tiny_llama(), byte_tokenizer(eos_id=-1)
    config = EngineConfig(block_size=16, kv_cache_memory_bytes=320 * 2**20,
                          kv_segment_bytes=16 * 2**20, kv_release_after=0)
    engine = LLMEngine(config, model, tok)
    run(engine, [tok.encode("warm up")], 2)
    base = _rss_mib()
    engine.grow_kv_pool(engine.kv_cache_manager.pool.max_num_blocks)
    run(engine, [tok.encode("hello")], 2)  # the step grows the arrays
    grown = _rss_mib()
    assert engine.runner.kv_cache.nbytes >= 319 * 2**20
    assert grown - base > 250, (base, grown)
    assert engine.release_kv_memory()
    released = _rss_mib()
    assert engine.runner.kv_cache.nbytes <= 16 * 2**20
    assert released - base < 60 and grown - released > 250, (base, grown, released)
