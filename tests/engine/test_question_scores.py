"""Question groups: a document prefilled once, each question scored as a choice row forking it.

Oracles: mlx-lm's own forward pass over the whole sequence (document, question, label), its
float64 log-softmax summed over the label's tokens (teacher forcing); the same questions as
separate choice rows; and the tokens the scheduler computes, counted by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.choice_scores import label_probs
from mlxpa.request import EngineRequest, QuestionPrompt, common_prefix
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.engine.test_llm_engine import tiny_pool
from tests.tiny_models import (
    byte_tokenizer,
    teacher_forced,
    tiny_gemma3,
    tiny_llama,
)

DOCS = ["The kettle boiled in a minute and the lid broke after a week of use, sadly.",
        "Short note.",
        "A tent that kept us dry for three nights of rain in the hills; the poles bent."]
QUESTIONS = [("\nTopic:", ("kitchen", "camping", "other")),
             ("\nGood? ", ("yes", "no")),
             ("\nStars (1-5): ", ("1", "2", "3", "4", "5")),
             ("\nWord: ", ("ab", "abc", "b"))]  # one label extends another
CONFIGS = {
    "plain": EngineConfig(block_size=8, num_blocks=256),
    "chunked": EngineConfig(block_size=8, num_blocks=256, max_num_batched_tokens=13),
    "few-seqs": EngineConfig(block_size=8, num_blocks=256, max_num_seqs=2),
    "tiny-pool": EngineConfig(block_size=4, num_blocks=28, max_num_batched_tokens=16,
                              max_num_seqs=4),
    "no-cache": EngineConfig(block_size=8, num_blocks=256, enable_prefix_caching=False),
}


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


def group(tok, rid: str, doc: str, questions=QUESTIONS) -> EngineRequest:
    prompts = [QuestionPrompt(tok.encode(doc + suffix), labels) for suffix, labels in questions]
    shared = common_prefix([p.prompt_token_ids for p in prompts])
    return EngineRequest(rid, prompts[0].prompt_token_ids[:shared], SamplingParams(),
                         tuple(prompts))



def run(model, requests, config, tok=None):
    eng = LLMEngine(config, model, tok or byte_tokenizer())
    computed, steps = [0], eng.scheduler.schedule

    def counting():
        out = steps()
        computed[0] += out.total_num_scheduled_tokens
        assert not any(out.sampling)  # nothing is decoded
        return out

    eng.scheduler.schedule = counting
    outs = {o.request_id: o for o in eng.generate(requests)}
    eng.kv_cache_manager.check_invariants([])
    assert len(eng.question_scores) == 0 and len(eng.choice_scores) == 0
    return eng, outs, computed[0]


@pytest.mark.parametrize("name", CONFIGS)
def test_question_scores_match_mlx_lm_teacher_forcing(model, name):
    """Every question's label log-probabilities equal mlx-lm's teacher-forced scores of the
    whole sequence; probabilities and the outside mass follow from them (one output per
    group, questions in order), chunked, with few sequence slots (questions wait and read
    the document from the prefix cache), through a pool that preempts, without the cache."""
    tok = byte_tokenizer()
    config = CONFIGS[name]
    if name == "tiny-pool":
        config = replace(config, num_blocks=tiny_pool(model, 28, 64))
    eng, outs, _ = run(model, [group(tok, str(i), d) for i, d in enumerate(DOCS)], config)
    if name == "tiny-pool":
        assert eng.counters.num_preemptions > 0
    assert sorted(outs) == ["0", "1", "2"]
    for i, doc in enumerate(DOCS):
        out = outs[str(i)]
        assert out.error is None and out.finish_reason == "stop" and out.token_ids == []
        assert len(out.question_scores) == len(QUESTIONS)
        for (suffix, labels), got in zip(QUESTIONS, out.question_scores):
            want = teacher_forced(model, tok, tok.encode(doc + suffix), labels)
            assert list(got.logprobs) == list(labels)
            for c, w in zip(labels, want):
                assert abs(got.logprobs[c] - w) < 1e-3, (name, i, suffix, c)
            probs, outside = label_probs(list(got.logprobs.values()),
                                         [tok.encode(c, add_special_tokens=False)
                                          for c in labels])
            assert [got.probs[c] for c in labels] == pytest.approx(probs, abs=1e-12)
            assert got.outside_prob == pytest.approx(outside, abs=1e-12)


def test_questions_equal_separate_choice_rows(model):
    """The same questions as separate choice rows (each its whole prompt, greedy) get the
    same label log-probabilities as the group's questions."""
    tok = byte_tokenizer()
    rows = [EngineRequest(f"{i}/{k}", tok.encode(d + s),
                          SamplingParams(structured_outputs=StructuredOutput.make("choice",
                                                                                  list(ls))))
            for i, d in enumerate(DOCS) for k, (s, ls) in enumerate(QUESTIONS)]
    _, separate, _ = run(model, rows, CONFIGS["plain"])
    _, grouped, _ = run(model, [group(tok, str(i), d) for i, d in enumerate(DOCS)],
                        CONFIGS["plain"])
    for i in range(len(DOCS)):
        for k in range(len(QUESTIONS)):
            row, got = separate[f"{i}/{k}"], grouped[str(i)].question_scores[k]
            assert got.logprobs == pytest.approx(row.choice_logprobs, abs=1e-5)
            assert got.outside_prob == pytest.approx(row.choice_outside_prob, abs=1e-6)


def test_the_document_is_prefilled_once(model):
    """Without a prefix cache, a group computes its document once, then each question's own
    tokens and its longer labels' tokens; the same questions as separate rows compute the
    document once per question. Counted: every token the scheduler schedules."""
    tok = byte_tokenizer()
    doc = DOCS[0] * 3
    req = group(tok, "g", doc)
    doc_len = len(tok.encode(doc + "\n"))  # every suffix starts with "\n", then differs
    assert len(req.prompt_token_ids) == doc_len
    labels_cost = sum(len(c) for _, ls in QUESTIONS for c in ls if len(c) > 1)
    own = sum(len(tok.encode(doc + s)) - doc_len for s, _ in QUESTIONS)
    eng, outs, computed = run(model, [req], CONFIGS["no-cache"])
    assert computed == doc_len + own + labels_cost
    assert outs["g"].num_prompt_tokens == doc_len + own
    assert eng.counters.prompt_tokens == doc_len + own and eng.counters.requests == 1
    rows = [EngineRequest(f"r{k}", tok.encode(doc + s), SamplingParams(
        structured_outputs=StructuredOutput.make("choice", list(ls))))
        for k, (s, ls) in enumerate(QUESTIONS)]
    _, _, separate = run(model, rows, CONFIGS["no-cache"])
    assert separate == len(QUESTIONS) * doc_len + own + labels_cost


def test_the_document_is_the_questions_common_prefix(model):
    """The group's document is the longest common prefix of its questions' prompts whatever
    the request's own tokens say (chat renderings share the conversation's tokens), cut
    before the earliest question's labels; questions whose prompts are the same text (two
    label sets after one question) still score one position each. The prefix cache then
    serves a second group with the same document."""
    tok = byte_tokenizer()
    doc = DOCS[2]
    same = [("\nA: ", ("yes", "no")), ("\nA: ", ("good", "bad"))]
    prompts = tuple(QuestionPrompt(tok.encode(doc + s), ls) for s, ls in same)
    requests = [EngineRequest(rid, tok.encode(doc)[:5], SamplingParams(), prompts)
                for rid in ("a", "b")]
    eng, outs, computed = run(model, requests[:1], CONFIGS["no-cache"])
    full = len(prompts[0].prompt_token_ids)
    assert computed == (full - 1) + 2 * 1 + (3 + 2 + 4 + 3)  # document, a token each, labels
    for (s, ls), got in zip(same, outs["a"].question_scores):
        want = teacher_forced(model, tok, tok.encode(doc + s), ls)
        assert list(got.logprobs.values()) == pytest.approx(want, abs=1e-3)
    eng, outs, _ = run(model, requests, CONFIGS["plain"])
    assert outs["b"].num_cached_tokens >= (full - 1) // 8 * 8 - 8 > 0


def test_one_question_runs_as_a_choice_row(model):
    """A group of one question has no document request: the question's choice prefill is
    the only prefill (its prompt computed once)."""
    tok = byte_tokenizer()
    req = group(tok, "one", DOCS[1], QUESTIONS[1:2])
    _, outs, computed = run(model, [req], CONFIGS["no-cache"])
    prompt = tok.encode(DOCS[1] + QUESTIONS[1][0])
    assert computed == len(prompt) + 3 + 2  # "yes", "no": their tokens after the first
    (got,) = outs["one"].question_scores
    want = teacher_forced(model, tok, prompt, QUESTIONS[1][1])
    assert list(got.logprobs.values()) == pytest.approx(want, abs=1e-3)


def test_a_bad_question_fails_its_group_alone(model):
    """Labels that are the same tokens after a question fail that group before any work,
    naming the question's field; the other group runs."""
    tok = byte_tokenizer()
    bad = group(tok, "bad", DOCS[0], [QUESTIONS[0], ("\nA: ", ("€", "™"))])
    _, outs, _ = run(model, [bad, group(tok, "ok", DOCS[1])], CONFIGS["plain"])
    assert outs["bad"].finish_reason == "abort" and outs["bad"].question_scores is None
    assert outs["bad"].error == ('field "questions[1].labels": labels "€" and "™" are the '
                                 "same tokens after the prompt ([0])")
    assert outs["ok"].error is None and len(outs["ok"].question_scores) == len(QUESTIONS)


def test_abort_drops_every_request_of_a_group(model):
    """Aborting a group after its document's prefill (its questions running) leaves no
    request, block or bookkeeping behind, and the engine runs the next group."""
    tok = byte_tokenizer()
    eng = LLMEngine(CONFIGS["plain"], model, tok)
    assert eng.add_request(*group(tok, "x", DOCS[0] * 2)) is None
    eng.step()  # the document's prefill; the questions fork it
    assert eng.scheduler.running and len(eng.question_scores) == 1
    eng.abort_request("x")
    eng.step()
    assert not eng.has_unfinished_requests() and len(eng.question_scores) == 0
    assert len(eng.choice_scores) == 0
    eng.kv_cache_manager.check_invariants([])
    (out,) = list(eng.generate([group(tok, "y", DOCS[1])]))
    assert out.request_id == "y" and out.error is None
