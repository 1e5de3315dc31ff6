"""Speculative decoding in the engine (tiny random models): the tokens, log-probabilities and
finish of every request equal the engine's without speculation (and mlx-lm's greedy
generation), whatever the drafts: forced all-accepted (the reference continuation proposed),
forced all-rejected (every draft off by one), and the real proposers; with penalties,
``logit_bias``, stops inside an accepted run, grammars, forks, prefix hits, preemption,
sliding windows, quantized KV and streams."""

from __future__ import annotations

import json

import jsonschema
import pytest

import mlxpa.worker.model_runner as model_runner
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import RequestOutputKind, SamplingParams, StructuredOutput
from mlxpa.spec_decode.gate import SpecGate
from tests.engine.test_llm_engine import mlx_lm_greedy
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_gemma3, tiny_llama

PROMPTS = ["abcabcabcabcabc", "hello hello hello hello", "a",
           "The quick brown fox jumps over the lazy dog. " * 2, "0123456789abcde"]
SPEC = {"method": "ngram", "num_speculative_tokens": 4}


class Oracle:
    """Proposes the continuation of a reference run (``shift`` 0: every draft accepted), or
    each of its tokens plus ``shift`` (every draft rejected), after any prefix of it."""

    def __init__(self, refs: list[list[int]], shift: int = 0) -> None:
        self.refs, self.shift, self.seen = refs, shift, {}

    def add_request(self, key, prompt):
        self.seen[key] = list(prompt)

    def propose(self, key, token_ids, k):
        have = list(token_ids)
        assert have[:len(self.seen[key])] == self.seen[key]  # only its own tokens
        for ref in self.refs:
            if ref[:len(have)] == have:
                return [(t + self.shift) % VOCAB for t in ref[len(have):len(have) + k]]
        return []

    def finish_request(self, key, output):
        self.seen.pop(key)


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


def run(model, params, spec=None, config=None, prompts=PROMPTS, tok=None):
    tok = tok or byte_tokenizer(eos_id=-1)
    eng = LLMEngine(EngineConfig(**{"num_blocks": 256, **(config or {})},
                                 speculative_config=spec), model, tok)
    ps = params if isinstance(params, list) else [params] * len(prompts)
    outs = {}
    for o in eng.generate(EngineRequest(str(i), tok.encode(p), ps[i])
                          for i, p in enumerate(prompts)):
        outs.setdefault(int(o.request_id), []).append(o)
    eng.kv_cache_manager.check_invariants([])
    return {i: sorted(v, key=lambda o: o.sample_index) for i, v in outs.items()}, eng


def refs_of(outs, tok=None, prompts=PROMPTS):
    tok = tok or byte_tokenizer(eos_id=-1)
    return [tok.encode(prompts[i]) + o.token_ids for i, v in outs.items() for o in v]


@pytest.fixture
def forced(monkeypatch):
    """Every decode row gets its full draft count, whatever the gate would pick."""
    monkeypatch.setattr(SpecGate, "num_drafts", lambda self, rows: self.max_k)
    monkeypatch.setattr(SpecGate, "worth_proposing", lambda self, keys: True)


def with_proposer(monkeypatch, proposer):
    monkeypatch.setattr(model_runner, "make_proposer", lambda config: proposer)


def same(a, b, logprobs=False):
    assert sorted(a) == sorted(b)
    for i in a:
        for x, y in zip(a[i], b[i], strict=True):
            assert (x.token_ids, x.text, x.finish_reason, x.stop_reason) == (
                y.token_ids, y.text, y.finish_reason, y.stop_reason), i
            if logprobs and (x.logprobs is not None or y.logprobs is not None):
                assert len(x.logprobs) == len(y.logprobs) == len(x.token_ids)
                for p, q in zip(x.logprobs, y.logprobs):
                    assert p.token_id == q.token_id and p.rank == q.rank
                    assert p.logprob == pytest.approx(q.logprob, rel=1e-4, abs=1e-4)
                    assert [t for t, _ in p.top] == [t for t, _ in q.top]


@pytest.mark.parametrize("shift", [0, 1], ids=["all-accepted", "all-rejected"])
def test_greedy_identical_and_rollback(model, monkeypatch, forced, shift):
    params = SamplingParams(max_tokens=20, logprobs=3)
    plain, _ = run(model, params)
    tok = byte_tokenizer(eos_id=-1)
    for i, p in enumerate(PROMPTS):  # the plain engine is mlx-lm's greedy generation
        assert plain[i][0].token_ids == mlx_lm_greedy(model, tok.encode(p), 20)
    with_proposer(monkeypatch, Oracle(refs_of(plain), shift))
    spec, eng = run(model, params, SPEC)
    same(plain, spec, logprobs=True)
    c = eng.counters
    assert c.spec.num_draft_tokens > 40
    if shift:  # rejected drafts' K/V were written and then written over
        assert c.spec.num_accepted_tokens == 0
    else:
        assert c.spec.num_accepted_tokens == c.spec.num_draft_tokens
        assert c.num_steps < 20 / 2  # five tokens a step after the prefill
    assert c.spec.num_accepted_tokens_per_pos[0] == (0 if shift else c.spec.num_drafts)


class Intermittent(Oracle):
    """Drafts (rejected) after an odd number of tokens only: a step without drafts follows
    one whose drafts took a new block."""

    def propose(self, key, token_ids, k):
        return super().propose(key, token_ids, k) if len(token_ids) % 2 else []


def test_a_table_longer_than_the_context(model, monkeypatch, forced):
    """One request a step (a server at one client): after rejected drafts that crossed a
    block boundary, its block table holds a block past the next step's context (this
    crashed the engine: could not broadcast (18,) into (17,))."""
    params = SamplingParams(max_tokens=40)
    for p in PROMPTS:
        plain, _ = run(model, params, prompts=[p])
        with_proposer(monkeypatch, Intermittent(refs_of(plain, prompts=[p]), shift=1))
        spec, eng = run(model, params, SPEC, prompts=[p])
        same(plain, spec)
        assert eng.counters.spec.num_draft_tokens >= 4 * 10


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.9, seed=7), dict(temperature=1.2, top_k=20, top_p=0.9, seed=3),
    dict(temperature=0.7, min_p=0.05, seed=11)], ids=["plain", "top-k-p", "min-p"])
def test_seeded_sampled_rows_identical(model, monkeypatch, forced, sampling):
    params = SamplingParams(max_tokens=16, **sampling)
    plain, _ = run(model, params)
    with_proposer(monkeypatch, Oracle(refs_of(plain)))
    spec, eng = run(model, params, SPEC)
    same(plain, spec)
    assert eng.counters.spec.num_accepted_tokens > 30
    with_proposer(monkeypatch, Oracle(refs_of(plain), shift=5))  # rejected: drawn again
    same(plain, run(model, params, SPEC)[0])


def test_penalties_and_logit_bias_count_accepted_drafts(model, monkeypatch, forced):
    params = [SamplingParams(max_tokens=18, repetition_penalty=1.4),
              SamplingParams(max_tokens=18, frequency_penalty=0.8, presence_penalty=0.3),
              SamplingParams(max_tokens=18, logit_bias={98: 5.0, 99: -100.0}),
              SamplingParams(max_tokens=18, temperature=0.8, seed=5, frequency_penalty=1.0,
                             logit_bias={97: 2.0}),
              SamplingParams(max_tokens=18, presence_penalty=1.5, logprobs=2)]
    plain, _ = run(model, params)
    for shift in (0, 1):
        with_proposer(monkeypatch, Oracle(refs_of(plain), shift))
        spec, eng = run(model, params, SPEC)
        same(plain, spec, logprobs=True)
        assert eng.counters.spec.num_draft_tokens > 20


def test_stops_inside_an_accepted_run(monkeypatch, forced):
    model = tiny_llama()
    free, _ = run(model, SamplingParams(max_tokens=24))
    texts = {i: v[0].text for i, v in free.items()}
    tok = byte_tokenizer(eos_id=min(set(range(VOCAB)) - {t for v in free.values()
                                                         for t in v[0].token_ids}))
    params = [SamplingParams(max_tokens=24, stop=[texts[0][5:8]]),
              SamplingParams(max_tokens=24, stop_token_ids=[free[1][0].token_ids[6]]),
              SamplingParams(max_tokens=7),
              SamplingParams(max_tokens=24, stop=[texts[3][3:5]], include_stop_str_in_output=True,
                             min_tokens=2),
              SamplingParams(max_tokens=24, stop_token_ids=[free[4][0].token_ids[1]],
                             min_tokens=4)]
    plain, _ = run(model, params, tok=tok)
    # (row 4's ban below min_tokens may steer it away from its stop id)
    assert [plain[i][0].finish_reason for i in range(4)] == ["stop", "stop", "length", "stop"]
    with_proposer(monkeypatch, Oracle(refs_of(free)))  # drafts run past each stop
    spec, eng = run(model, params, SPEC, tok=tok)
    same(plain, spec)
    assert eng.counters.spec.num_accepted_tokens > 10


def test_eos_inside_an_accepted_run(monkeypatch, forced):
    model = tiny_llama()
    free, _ = run(model, SamplingParams(max_tokens=24))
    eos = free[3][0].token_ids[9]
    tok = byte_tokenizer(eos_id=eos)
    plain, _ = run(model, SamplingParams(max_tokens=24), tok=tok)
    assert plain[3][0].finish_reason == "stop" and len(plain[3][0].token_ids) <= 10
    with_proposer(monkeypatch, Oracle(refs_of(free)))
    same(plain, run(model, SamplingParams(max_tokens=24), SPEC, tok=tok)[0])


SCHEMA = {"type": "object", "properties": {"label": {"enum": ["pos", "neg"]},
                                           "ok": {"type": "boolean"}},
          "required": ["label", "ok"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}


@pytest.mark.parametrize("shift", [0, 3])
def test_grammar_masks_each_draft_position(model, monkeypatch, forced, shift):
    tok = byte_tokenizer()
    so = [StructuredOutput.make("json", SCHEMA), StructuredOutput.make("regex", "[0-9]{2,6}-x+"),
          None, StructuredOutput.make("grammar", 'start: "ab" ("c" | "d")+ "!"'), None]
    params = [SamplingParams(max_tokens=30, structured_outputs=s) for s in so]
    plain, _ = run(model, params, tok=tok)
    free, _ = run(model, SamplingParams(max_tokens=30), tok=tok)
    # drafts from the unconstrained run (mostly outside the grammar) or the constrained one
    with_proposer(monkeypatch, Oracle(refs_of(free if shift else plain, tok), shift))
    spec, eng = run(model, params, SPEC, tok=tok)
    same(plain, spec)
    jsonschema.validate(json.loads(spec[0][0].text), SCHEMA)
    assert eng.counters.spec.num_draft_tokens > 0


def test_forks_prefix_hits_and_preemption(model, monkeypatch, forced):
    params = SamplingParams(max_tokens=14, n=3, temperature=0.8, seed=1)
    small = {"block_size": 8, "num_blocks": 26, "max_num_batched_tokens": 32}
    plain, eng0 = run(model, params, config=small)
    with_proposer(monkeypatch, Oracle(refs_of(plain)))
    spec, eng = run(model, params, SPEC, config=small)
    same(plain, spec)
    assert eng.counters.spec.num_accepted_tokens > 20
    big, _ = run(model, params)
    same(big, spec)
    twice = PROMPTS + PROMPTS  # the second copy hits the prefix cache
    with_proposer(monkeypatch, Oracle(refs_of(plain) * 2))
    again, eng = run(model, SamplingParams(max_tokens=14), SPEC, prompts=twice)
    ref, _ = run(model, SamplingParams(max_tokens=14), prompts=twice)
    same(ref, again)
    assert eng.counters.cached_prompt_tokens > 0


@pytest.mark.parametrize("config", [{"kv_cache_dtype": "int8"}, {"disable_cascade_attn": True}])
def test_quantized_kv_and_cascade_off(monkeypatch, forced, config):
    model = tiny_gemma3(sliding_window=8)
    params = SamplingParams(max_tokens=16)
    plain, _ = run(model, params, config=config)
    with_proposer(monkeypatch, Oracle(refs_of(plain)))
    same(plain, run(model, params, SPEC, config=config)[0])


def test_streams_carry_several_tokens_a_step(monkeypatch, forced):
    model = tiny_llama()
    final, _ = run(model, SamplingParams(max_tokens=20, stop=["zz"]))
    with_proposer(monkeypatch, Oracle(refs_of(final)))
    delta = SamplingParams(max_tokens=20, stop=["zz"], output_kind=RequestOutputKind.DELTA)
    spec, eng = run(model, delta, SPEC)
    for i, pieces in spec.items():
        assert "".join(p.text for p in pieces) == final[i][0].text
        assert sum((p.token_ids for p in pieces), []) == final[i][0].token_ids
        assert max(len(p.token_ids) for p in pieces) > 1
    assert eng.counters.spec.num_accepted_tokens > 0


def test_ngram_drafts_from_the_request_alone(model, monkeypatch, forced):
    """The real n-gram proposer, every draft it has verified (the gate would often skip rows
    this tiny model rarely repeats in): identical outputs, drafts accepted on repetitive text,
    and every token the proposer saw was its own request's."""
    from mlxpa.spec_decode import make_proposer

    params = SamplingParams(max_tokens=32)
    plain, _ = run(model, params)
    seen = {}
    real = make_proposer(EngineConfig(speculative_config=SPEC).speculative_config)

    class Watch:
        def add_request(self, key, prompt):
            seen[key] = list(prompt)
            real.add_request(key, prompt)

        def propose(self, key, token_ids, k):
            assert list(token_ids)[:len(seen[key])] == seen[key]
            drafts = real.propose(key, token_ids, k)
            assert set(drafts) <= set(token_ids)  # n-gram: copied from its own context
            return drafts

        def finish_request(self, key, output):
            real.finish_request(key, output)

    with_proposer(monkeypatch, Watch())
    spec, eng = run(model, params, SPEC)
    same(plain, spec)
    assert eng.counters.spec.num_accepted_tokens > 0


def test_recurrent_models_are_not_drafted():
    from tests.loader.tiny_archs import build

    model = build("qwen3_next")
    params = SamplingParams(max_tokens=8)
    plain, _ = run(model, params, prompts=PROMPTS[:2])
    spec, eng = run(model, params, SPEC, prompts=PROMPTS[:2])
    same(plain, spec)
    assert eng.scheduler.spec_gate is None and eng.runner.drafter is None
    assert eng.counters.spec.num_drafts == 0


def test_suffix_drafts_from_earlier_outputs(model, forced):
    """The real suffix proposer, one row at a time over a repeated prompt: outputs equal the
    plain engine's, and the later rows' drafts come from the first row's finished output, so
    nearly all of them are accepted (greedy: the same continuation)."""
    params = SamplingParams(max_tokens=24)
    prompts = ["hello world, say it"] * 4
    config = {"max_num_seqs": 1}
    plain, _ = run(model, params, config=config, prompts=prompts)
    spec, eng = run(model, params, {"method": "suffix", "num_speculative_tokens": 4},
                    config=config, prompts=prompts)
    same(plain, spec)
    c = eng.counters
    # Rows 2-4 emit 23 tokens each after their first; a draft's length is capped by its match
    # length (max_spec_factor 1), which grows from 1 as each row runs.
    assert c.spec.num_accepted_tokens >= 40
    assert c.spec.num_accepted_tokens >= 0.8 * c.spec.num_draft_tokens


def test_abort_while_verifying_leaks_nothing_and_shares_nothing(monkeypatch, forced):
    """Requests aborted between steps that verify drafts: their blocks come back, the rest
    finish as without speculation, and the proposer hears None for each aborted one (its
    tokens are kept for nobody)."""
    model = tiny_llama()
    params = SamplingParams(max_tokens=20)
    plain, _ = run(model, params)
    oracle = Oracle(refs_of(plain))
    finished = {}
    real_finish = oracle.finish_request

    def finish(key, output):
        finished[key] = output
        real_finish(key, output)

    oracle.finish_request = finish
    with_proposer(monkeypatch, oracle)
    tok = byte_tokenizer(eos_id=-1)
    eng = LLMEngine(EngineConfig(num_blocks=256, speculative_config=SPEC), model, tok)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), tok.encode(p), params)
    outs = {}
    for step in range(40):
        if step == 3:
            eng.abort_request(["1", "3"])
        for o in eng.step():
            if o.finished:
                outs[int(o.request_id)] = o
        if not eng.has_unfinished_requests():
            break
    eng.step()  # the runner frees the aborted requests' state at the next step
    assert sorted(outs) == [0, 2, 4]
    for i in outs:
        assert outs[i].token_ids == plain[i][0].token_ids
    assert eng.counters.spec.num_accepted_tokens > 0
    assert sum(v is None for v in finished.values()) == 2
    eng.kv_cache_manager.check_invariants([])
    assert eng.kv_cache_manager.num_active_blocks == 0
