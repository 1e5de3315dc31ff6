"""Hybrid and state-space models (a recurrent state per request beside the paged K/V) against
mlx-lm's own ``generate_step``: greedy ids identical with chunked prefill, preemption, prefix
hits that resume from a recurrent snapshot (rows sharing a prefix in one input, and a later
request hitting what two earlier ones shared), ``n > 1`` samples and choice labels that fork
their parent's state instead of computing the prompt again; no block or state left after a run
or an abort."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.engine.test_llm_engine import MAX_TOKENS, PROMPTS, mlx_lm_greedy, run_engine
from tests.loader.tiny_archs import build
from tests.tiny_models import byte_tokenizer, teacher_forced

PREFIX = "You are a careful annotator. Label each line: "  # 46 tokens: 5 blocks of 8, + 6
SUFFIXES = ["alpha", "beta gamma", "delta!", "epsilon zeta", "eta", "theta iota kappa"]


@pytest.fixture(scope="module", params=["qwen3_next", "lfm2", "mamba2"])
def model_and_refs(request):
    model = build(request.param)
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    return model, tok, ids, [mlx_lm_greedy(model, p, MAX_TOKENS) for p in ids]


def _clean(eng: LLMEngine) -> None:
    """Nothing is left after the requests: no live state, no block but the prefix cache's,
    and the cache empties completely."""
    kv = eng.kv_cache_manager
    assert not eng.runner.states.keys()
    kv.check_invariants([])
    assert kv.num_active_blocks == 0
    kv.tree.evict(kv.pool.num_usable_blocks)
    assert kv.pool.num_free_blocks == kv.pool.num_usable_blocks


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=8, num_blocks=64),
    EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=7),   # chunked prefill
    EngineConfig(block_size=8, num_blocks=20, max_num_batched_tokens=32),  # preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_mlx_lm(model_and_refs, config):
    model, tok, ids, refs = model_and_refs
    eng, outs = run_engine(model, tok, ids, config)
    assert eng.runner.states is not None and eng.kv_cache_manager.enable_prefix_caching
    for i, ref in enumerate(refs):
        assert outs[i].token_ids == ref, f"prompt {i}"
    if config.num_blocks == 20 and eng.runner.geometry.has_kv:
        assert eng.counters.num_preemptions > 0
    if eng.scheduler.has_finished_requests():
        eng.step()
    _clean(eng)


@pytest.mark.parametrize("chunk", [2048, 12], ids=["whole", "chunked"])
def test_rows_sharing_a_prefix_resume_from_its_snapshot(model_and_refs, chunk):
    """Six rows of one input share 40 tokens (5 blocks): the first computes them and saves
    its state there; the other five resume from that snapshot (the workload's ceiling of
    cached tokens), and every row's greedy ids equal mlx-lm's."""
    model, tok, _, _ = model_and_refs
    ids = [tok.encode(PREFIX + s) for s in SUFFIXES]
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=96, max_num_batched_tokens=chunk),
                    model, tok)
    params = SamplingParams(max_tokens=6)
    outs = {o.request_id: o for o in eng.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    for i, p in enumerate(ids):
        assert outs[str(i)].token_ids == mlx_lm_greedy(model, p, 6), i
    assert [outs[str(i)].num_cached_tokens for i in range(6)] == [0] + [40] * 5
    assert eng.counters.cached_prompt_tokens == 5 * 40
    _clean(eng)


def test_a_later_request_hits_the_prefix_two_earlier_ones_shared(model_and_refs):
    """A server's requests arrive one by one: the first shares nothing yet, the second finds
    the first's prefix in the tree without a snapshot and saves one where they diverge, the
    third resumes from it."""
    model, tok, _, _ = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=96), model, tok)
    params = SamplingParams(max_tokens=5)
    cached = []
    for i, s in enumerate(SUFFIXES[:3]):
        ids = tok.encode(PREFIX + s)
        (out,) = eng.generate([EngineRequest(str(i), ids, params)])
        assert out.token_ids == mlx_lm_greedy(model, ids, 5), i
        cached.append(out.num_cached_tokens)
    assert cached == [0, 0, 40]
    _clean(eng)


def _prompt_tokens_computed(eng: LLMEngine) -> list[int]:
    """Spy on the scheduler: per step, the prompt tokens computed (positions before the
    prompt's end)."""
    counts: list[int] = []
    schedule = eng.scheduler.schedule

    def spy():
        out = schedule()
        counts.append(sum(max(0, min(r.num_computed_tokens + n, r.num_prompt_tokens)
                              - r.num_computed_tokens)
                          for r, n in zip(out.requests, out.num_scheduled_tokens)))
        return out

    eng.scheduler.schedule = spy
    return counts


def test_samples_fork_the_parents_state(model_and_refs):
    """``n = 4``: the parent saves its state before its last prompt token, the other three
    samples restore it and compute that one token each: the prompt is computed once (plus
    three tokens), and every sample is mlx-lm's greedy continuation."""
    model, tok, ids, refs = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64), model, tok)
    counts = _prompt_tokens_computed(eng)
    outs = list(eng.generate([EngineRequest("p", ids[3], SamplingParams(max_tokens=MAX_TOKENS,
                                                                        n=4))]))
    assert sorted(o.sample_index for o in outs) == [0, 1, 2, 3]
    assert all(o.token_ids == refs[3] for o in outs)
    assert sum(counts) == len(ids[3]) + 3
    _clean(eng)


def test_choice_labels_fork_the_prefill_state(model_and_refs):
    """A choice row: one prefill, each multi-token label scored by a request that restores
    the prefill's state; the scores equal mlx-lm's teacher-forced log-probabilities."""
    model, tok, _, _ = model_and_refs
    labels = ["positive", "negative", "mixed feelings"]
    ids = tok.encode(PREFIX + "great phone, awful battery. Sentiment: ")
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=96), model, tok)
    counts = _prompt_tokens_computed(eng)
    so = StructuredOutput.make("choice", labels)
    (out,) = eng.generate([EngineRequest("c", ids, SamplingParams(structured_outputs=so))])
    want = teacher_forced(model, tok, ids, labels)
    for label, w in zip(labels, want):
        assert abs(out.choice_logprobs[label] - w) < 1e-3, label
    assert sum(counts) == len(ids) + sum(len(tok.encode(x, add_special_tokens=False))
                                         for x in labels)
    _clean(eng)


def test_abort_leaves_no_state_or_block(model_and_refs):
    model, tok, ids, _ = model_and_refs
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64, max_num_batched_tokens=16),
                    model, tok)
    for i, p in enumerate(ids):
        eng.add_request(str(i), p, SamplingParams(max_tokens=MAX_TOKENS, n=2))
    for _ in range(4):
        eng.step()
    eng.abort_unfinished()
    assert not eng.has_unfinished_requests()
    _clean(eng)
