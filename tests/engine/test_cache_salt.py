"""``cache_salt`` end to end on tiny models (vLLM's CVE-2025-46570: a prefix hit's TTFT told
one tenant what another's prompt held). Oracles: the engine's own counters (prompt tokens
computed and served from the cache) and each output's ``num_cached_tokens``; greedy ids equal
mlx-lm's own generation. A salted request never hits blocks another salt computed (nor the
unsalted ones); the same salt hits as unsalted requests always did; its ``n > 1`` samples,
choice labels and questions read its own namespace; a bad salt is refused before the engine
loop and never stops it."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.engine.test_llm_engine import mlx_lm_greedy
from tests.engine.test_question_scores import group
from tests.loader.tiny_archs import build
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

BS = 8
SYSTEM = "You are a careful annotator. Answer briefly. "  # 45 tokens: 5 full blocks + 5
PROMPT = SYSTEM + "Q: one"  # 51 tokens: a hit covers 6 blocks, 48 tokens
MAX_TOKENS = 6
CONFIG = EngineConfig(block_size=BS, num_blocks=128, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(eos_id=-1)  # no EOS: every request runs max_tokens


def one(eng: LLMEngine, rid: str, ids: list[int], salt: str | None,
        params: SamplingParams | None = None, questions=None) -> list:
    """Run one request alone on ``eng`` (the cache keeps what earlier ones left)."""
    request = EngineRequest(rid, ids, params or SamplingParams(max_tokens=MAX_TOKENS),
                            questions, salt)
    outs = sorted(eng.generate([request]), key=lambda o: o.sample_index)
    eng.kv_cache_manager.check_invariants([])
    return outs


def computed(eng: LLMEngine) -> int:
    return eng.counters.prompt_tokens - eng.counters.cached_prompt_tokens


def test_a_hit_needs_the_same_salt_and_outputs_do_not_change(model, tok):
    ids = tok.encode(PROMPT)
    ref = mlx_lm_greedy(model, ids, MAX_TOKENS)
    eng = LLMEngine(CONFIG, model, tok)
    cached = []
    for k, salt in enumerate(["alice", "bob", "alice", None, None, "bob", "carol"]):
        before = computed(eng)
        (out,) = one(eng, str(k), ids, salt)
        assert out.token_ids == ref, salt  # the same tokens, hit or not
        cached.append(out.num_cached_tokens)
        assert computed(eng) - before == len(ids) - out.num_cached_tokens
    assert cached == [0, 0, 48, 0, 48, 48, 0]
    assert eng.counters.cached_prompt_tokens == 3 * 48
    roots = eng.kv_cache_manager.tree.roots()
    assert sorted(r.cache_salt or "" for r in roots) == ["", "alice", "bob", "carol"]


def test_in_one_batch_only_the_same_salt_waits_and_hits(model, tok):
    ids = tok.encode(PROMPT)
    ref = mlx_lm_greedy(model, ids, MAX_TOKENS)
    salts = ["alice", "bob", "alice", None, "bob", None]
    eng = LLMEngine(CONFIG, model, tok)
    outs = {o.request_id: o for o in eng.generate(
        EngineRequest(str(k), ids, SamplingParams(max_tokens=MAX_TOKENS), None, s)
        for k, s in enumerate(salts))}
    assert all(o.token_ids == ref for o in outs.values())
    assert [outs[str(k)].num_cached_tokens for k in range(6)] == [0, 0, 48, 0, 48, 48]
    assert computed(eng) == 3 * len(ids) + 3 * (len(ids) - 48)
    eng.kv_cache_manager.check_invariants([])


def test_samples_choices_and_questions_read_their_own_salt(model, tok):
    ids = tok.encode(PROMPT)
    eng = LLMEngine(EngineConfig(block_size=BS, num_blocks=256, max_num_seqs=2), model, tok)
    one(eng, "warm", ids, "bob")  # bob's namespace holds the prompt; the others do not
    # n = 4 with 2 sequence slots: sample 1 forks sample 0's blocks; samples 2 and 3 wait
    # and read the prompt from the cache, in the request's namespace ("alice"'s), not bob's
    samples = one(eng, "n4", ids, "alice", SamplingParams(max_tokens=MAX_TOKENS, n=4))
    assert [o.num_cached_tokens for o in samples] == [0, 0, 48, 48]
    ref = mlx_lm_greedy(model, ids, MAX_TOKENS)
    assert all(o.token_ids == ref for o in samples)
    so = StructuredOutput.make("choice", ["yes", "no way", "maybe not"])
    choice = SamplingParams(max_tokens=4, structured_outputs=so)
    (first,) = one(eng, "c1", ids, "carol", choice)
    (again,) = one(eng, "c2", ids, "carol", choice)
    (other,) = one(eng, "c3", ids, "dave", choice)
    assert (first.num_cached_tokens, other.num_cached_tokens) == (0, 0)
    assert again.num_cached_tokens == 48 and again.choice_logprobs == pytest.approx(
        first.choice_logprobs, abs=1e-4) and other.choice_logprobs == pytest.approx(
        first.choice_logprobs, abs=1e-4)
    g = group(tok, "q", PROMPT)
    (q1, q2, q3) = [one(eng, rid, g.prompt_token_ids, salt, g.sampling_params, g.questions)[0]
                    for rid, salt in (("q1", "erin"), ("q2", "frank"), ("q3", "erin"))]
    assert (q1.num_cached_tokens, q2.num_cached_tokens) == (0, 0)
    assert q3.num_cached_tokens > 0
    for a, b in zip(q1.question_scores, q3.question_scores):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


@pytest.mark.parametrize("arch", ["mamba2", "qwen3_next"])
def test_recurrent_snapshots_stay_in_their_salt(arch):
    """A hybrid or state-space model resumes from a snapshot saved where a prefix shared with
    a waiting row ends: only rows of the same salt count (and only they resume from it)."""
    model, tok = build(arch), byte_tokenizer(eos_id=-1)
    prompts = [tok.encode(SYSTEM + s) for s in ("alpha", "beta gamma", "delta!", "eta")]
    refs = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in prompts]
    salts = ["a", "b", "a", "b"]
    eng = LLMEngine(EngineConfig(block_size=BS, num_blocks=96), model, tok)
    outs = {o.request_id: o for o in eng.generate(
        EngineRequest(str(k), p, SamplingParams(max_tokens=MAX_TOKENS), None, s)
        for k, (p, s) in enumerate(zip(prompts, salts)))}
    assert [outs[str(k)].token_ids for k in range(4)] == refs
    assert [outs[str(k)].num_cached_tokens for k in range(4)] == [0, 0, 40, 40]
    eng.kv_cache_manager.check_invariants([])


BAD = [("", ValueError), ("x" * 257, ValueError), (7, TypeError), (["a"], TypeError),
       (b"salt", TypeError), ({"a": 1}, TypeError)]


@pytest.mark.parametrize("salt, error", BAD)
def test_a_bad_salt_is_refused_by_add_request(model, tok, salt, error):
    eng = LLMEngine(CONFIG, model, tok)
    with pytest.raises(error, match="cache_salt"):
        eng.add_request("x", tok.encode(PROMPT), SamplingParams(max_tokens=2), None, salt)
    assert not eng.has_unfinished_requests()
    (out,) = one(eng, "x", tok.encode(PROMPT), "ok")  # the id is free, the engine runs
    assert out.finish_reason == "length"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(salt=st.none() | st.booleans() | st.integers() | st.floats() | st.binary(max_size=4)
       | st.text(max_size=300) | st.text(st.sampled_from("\x00\u202e\U0001f600a"), max_size=3)
       | st.lists(st.text(max_size=2), max_size=2))
def test_fuzz_add_request_never_breaks_the_engine(salt):
    """Every odd salt is either taken (and the request runs) or refused with TypeError or
    ValueError, the engine untouched; afterwards a plain request runs."""
    eng = _fuzz_engine()
    ok = salt is None or isinstance(salt, str) and 0 < len(salt) <= 256
    try:
        eng.add_request("f", [3, 4, 5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=1), None,
                        salt)
    except (TypeError, ValueError) as e:
        assert not ok and "cache_salt" in str(e)
        assert not eng.has_unfinished_requests()
    else:
        assert ok
        outs = []
        while eng.has_unfinished_requests():
            outs += eng.step()
        assert [o.finish_reason for o in outs] == ["length"]
    eng.kv_cache_manager.check_invariants([])


@functools.cache
def _fuzz_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(block_size=4, num_blocks=64), tiny_llama(),
                     byte_tokenizer(eos_id=-1))


def test_suffix_decoding_never_shares_a_salted_output(monkeypatch):
    """The suffix proposer's store of finished outputs serves every later request: a salted
    request's output never enters it (its drafts' acceptance would time another tenant's
    text); an unsalted one's does, as before."""
    import mlxpa.worker.model_runner as model_runner
    from mlxpa.spec_decode.suffix import SuffixDecodingProposer

    finished: dict[int, object] = {}

    class Recording(SuffixDecodingProposer):
        def finish_request(self, key, output_token_ids):
            finished[key] = output_token_ids
            super().finish_request(key, output_token_ids)

    monkeypatch.setattr(model_runner, "make_proposer", lambda config: Recording(24, 64, 1.0, 0.1))
    tok = byte_tokenizer(eos_id=-1)
    eng = LLMEngine(EngineConfig(num_blocks=256, max_num_seqs=1, speculative_config={
        "method": "suffix", "num_speculative_tokens": 4}), tiny_llama(), tok)
    ids = tok.encode("hello world, say it")
    outs = {o.request_id: o for o in eng.generate(
        EngineRequest(str(k), ids, SamplingParams(max_tokens=12), None, s)
        for k, s in enumerate(["a", None, "a"]))}
    assert len(finished) == 3 and len({tuple(o.token_ids) for o in outs.values()}) == 1
    shared = [v for _, v in sorted(finished.items())]
    assert shared[0] is None and shared[2] is None and list(shared[1]) == outs["1"].token_ids
