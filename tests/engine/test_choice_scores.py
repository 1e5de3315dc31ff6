"""Choice rows are scored, not decoded (tiny random models, the byte tokenizer and a BPE one).

Oracles: hand-computed label distributions; a float64 log-softmax of mlx-lm's own forward pass
over prompt + label (the teacher-forced score of each label); a chi-square goodness-of-fit
test of seeded draws against ``choice_probs``."""

from __future__ import annotations

import importlib.util
import math
import os
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.data.rows import Row
from mlxpa.data.validate import validate
from mlxpa.engine import LLMEngine
from mlxpa.engine.choice_scores import choose_label, label_probs
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from mlxpa.structured.labels import LabelJoiner
from tests.engine.test_choice_canonical import merged_tokenizer
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_gemma3, tiny_llama
from tests.worker.test_logprobs import oracle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location(
        "choice_bench", os.path.join(ROOT, "benchmarks", "choice_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chi2_sf = _bench().chi2_sf


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


def teacher_forced(model, context: list[int], tokens: list[int]) -> list[float]:
    """Each label token's float64 log-probability after ``context`` and the tokens before
    it (mlx-lm's own forward over context + label, no cache)."""
    ref = oracle(model, context + tokens)
    return [ref[len(context) - 1 + j][t] for j, t in enumerate(tokens)]


def chi_square(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom over the cells of nonzero probability."""
    total = sum(counts)
    cells = [(c, p * total) for c, p in zip(counts, probs) if p > 0]
    return sum((c - e) ** 2 / e for c, e in cells), len(cells) - 1


def _rid(key) -> str:
    """The request id of a test's key: ``("greedy", 0)`` -> ``"greedy/0"``."""
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


def run(model, items, config=None, tok=None):
    tok = tok or byte_tokenizer()
    eng = LLMEngine(config or EngineConfig(block_size=8, num_blocks=128), model, tok)
    outs, keys = {}, {_rid(it[0]): it[0] for it in items}  # the engine's ids are strings
    for o in eng.generate(EngineRequest(_rid(key), *rest) for key, *rest in items):
        outs.setdefault(keys[o.request_id], []).append(o)
    eng.kv_cache_manager.check_invariants([])
    return eng, {k: sorted(v, key=lambda o: o.sample_index) for k, v in outs.items()}


# ------------------------------------------------------------------ hand-computed cases


def test_chi2_survival_function_matches_the_table():
    """The benchmark's chi-square tail (closed forms), at the 1% critical values of the
    table (df 2: -2 ln 0.01 exactly, as chi-square with 2 degrees is exponential)."""
    for df, x in ((1, 6.634897), (2, 9.210340), (3, 11.344867), (4, 13.276704),
                  (5, 15.086272)):
        assert abs(chi2_sf(x, df) - 0.01) < 1e-6, df
    assert abs(chi2_sf(-2 * math.log(0.01), 2) - 0.01) < 1e-15


def test_label_distribution_by_hand():
    """Greedy: the first highest score (ties go to the label given first). choice_probs:
    softmax of the scores. The outside mass counts a label whose tokens extend another's
    inside that one (``[1, 2]`` extends ``[1]``)."""
    greedy = SamplingParams()
    assert choose_label([-1.0, -0.5, -0.5, -2.0], greedy, 0) == 1
    assert choose_label([-3.0, -3.0], greedy, 0) == 0
    ln = math.log
    probs, outside = label_probs([ln(0.5), ln(0.3), ln(0.1)], [[1], [2], [3]])
    assert np.allclose(probs, [0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9], atol=1e-12)
    assert abs(outside - 0.1) < 1e-12
    probs, outside = label_probs([ln(0.5), ln(0.2), ln(0.1)], [[1], [1, 2], [3]])
    assert np.allclose(probs, [0.5 / 0.8, 0.2 / 0.8, 0.1 / 0.8], atol=1e-12)
    assert abs(outside - 0.4) < 1e-12  # 1 - (0.5 + 0.1): [1, 2] is inside [1]
    assert label_probs([0.0, ln(0.5)], [[1], [2]])[1] == 0.0  # clipped, never negative


P = [0.5, 0.3, 0.15, 0.05]


def _filtered(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


@pytest.mark.parametrize("params,want", [
    (SamplingParams(temperature=1.0), P),
    (SamplingParams(temperature=0.5), _filtered([p * p for p in P])),  # exp(2 ln p)
    (SamplingParams(temperature=2.0), _filtered([math.sqrt(p) for p in P])),
    (SamplingParams(temperature=1.0, top_k=2), _filtered([0.5, 0.3, 0, 0])),
    # mlx-lm's top-p keeps the fewest most likely labels whose mass reaches 0.7: 0.5 + 0.3
    (SamplingParams(temperature=1.0, top_p=0.7), _filtered([0.5, 0.3, 0, 0])),
    (SamplingParams(temperature=1.0, top_p=0.85), _filtered([0.5, 0.3, 0.15, 0])),
    # min-p keeps labels with p >= 0.4 * 0.5 = 0.2
    (SamplingParams(temperature=1.0, min_p=0.4), _filtered([0.5, 0.3, 0, 0])),
], ids=["t1", "t0.5", "t2", "top_k", "top_p0.7", "top_p0.85", "min_p"])
def test_label_draws_follow_the_filtered_distribution(params, want):
    """2,000 seeded draws over four labels match the hand-computed distribution (the
    filters and temperature applied to the labels as to tokens): labels filtered out never
    appear, the others pass a chi-square test at p > 0.01."""
    scores = [math.log(p) + 7.0 for p in P]  # any shift: the scores are normalised
    counts = Counter(choose_label(scores, params, seed) for seed in range(2000))
    observed = [counts[k] for k in range(len(P))]
    assert all(observed[k] == 0 for k, w in enumerate(want) if w == 0), observed
    stat, df = chi_square(observed, want)
    assert chi2_sf(stat, df) > 0.01, (observed, want, stat)


# ------------------------------------------------------------------ against mlx-lm

LABELS = ["good", "goo", "g", "bad!", "ba", "x"]  # shared first tokens, prefixes, 1 token
PROMPTS = ["Review: great phone. Sentiment:", "a longer prompt that spans several blocks of "
           "eight tokens, then asks: sentiment?", "zz"]
CONFIGS = {
    "plain": EngineConfig(block_size=8, num_blocks=128),
    "chunked": EngineConfig(block_size=8, num_blocks=128, max_num_batched_tokens=7),
    # every prompt one step's chunk: started as soon as it fits, not only with room to finish
    # (mlxpa.core.scheduler), so the pool preempts
    "tiny-pool": EngineConfig(block_size=4, num_blocks=24, max_num_batched_tokens=80,
                              max_num_seqs=3),
}


def check_row(model, tok, prompt_ids: list[int], outs, labels=LABELS) -> None:
    """Every output of one row against the oracle: scores, probabilities, the outside mass,
    the greedy label (argmax), the chosen label's tokens and per-token logprobs."""
    tokens = [tok.encode(c, add_special_tokens=False) for c in labels]
    per_token = [teacher_forced(model, prompt_ids, t) for t in tokens]
    scores = [sum(v) for v in per_token]
    probs, outside = label_probs(scores, tokens)
    for out in outs:
        assert out.error is None and out.finish_reason == "stop", out
        for c, want, p in zip(labels, scores, probs):
            assert abs(out.choice_logprobs[c] - want) < 1e-3, c
            assert abs(out.choice_probs[c] - p) < 1e-4, c
        assert abs(sum(out.choice_probs.values()) - 1) < 1e-9
        assert abs(out.choice_outside_prob - outside) < 1e-4
        k = labels.index(out.text)
        assert out.token_ids == tokens[k] and out.num_prompt_tokens == len(prompt_ids)
        if out.logprobs is not None:
            assert [v.token_id for v in out.logprobs] == tokens[k]
            for v, want in zip(out.logprobs, per_token[k]):
                assert abs(v.logprob - want) < 1e-4
    greedy = [o for o in outs if o.sample_index == 0 and o.request_id.startswith("greedy/")]
    for out in greedy:
        assert out.text == labels[int(np.argmax(scores))]


@pytest.mark.parametrize("name", CONFIGS)
def test_scores_and_labels_match_mlx_lm(model, name):
    """Greedy rows, seeded n = 3 rows with logprobs, the same prompt twice (the second a
    prefix-cache hit), in one prefill, chunked, and through a tiny pool that preempts."""
    tok = byte_tokenizer()
    so = StructuredOutput.make("choice", LABELS)
    items = []
    for j, p in enumerate(PROMPTS):
        ids = tok.encode(p)
        items += [(("greedy", j), ids, SamplingParams(max_tokens=8, structured_outputs=so)),
                  (("sampled", j), ids, SamplingParams(max_tokens=8, n=3, seed=j,
                                                       temperature=1.0, structured_outputs=so,
                                                       logprobs=2)),
                  (("again", j), ids, SamplingParams(max_tokens=8, structured_outputs=so))]
    config = CONFIGS[name]
    if name == "tiny-pool" and model.model_type == "gemma3_text":
        # a block holds one layer of one of its 3 KV cache groups (the 24 blocks above held
        # all 3 layers): 64 blocks still preempt here and keep the repeated prompt cached
        config = replace(config, num_blocks=64)
    eng, outs = run(model, items, config)
    if name == "tiny-pool":
        assert eng.counters.num_preemptions > 0
    for (kind, j), row in outs.items():
        assert len(row) == (3 if kind == "sampled" else 1)
        check_row(model, tok, tok.encode(PROMPTS[j]), row)
    long = tok.encode(PROMPTS[1])
    assert outs[("again", 1)][0].num_cached_tokens >= (len(long) - 1) // 8 * 8 - 8
    assert eng.counters.generation_tokens == sum(len(o.token_ids) for r in outs.values()
                                                 for o in r)
    sampled = outs[("sampled", 1)]
    ref = oracle(model, long)[-1]
    for out in sampled:  # the first label token's alternatives: the prompt's last logits
        assert [t for t, _ in out.logprobs[0].top] == list(np.argsort(-ref)[:2])


def test_greedy_label_is_the_best_label_where_decoding_is_not(model):
    """The issue's case: labels ``a+b1`` and ``a+b2`` share a first token ``a`` more likely
    than the third label's ``d``, so token-by-token greedy decoding would write ``a`` first;
    but ``d`` is the most likely whole label. The row's text is ``d``, its argmax."""
    tok = byte_tokenizer()
    found = 0
    for prompt in ["Review: great phone. Sentiment:", "The answer is", "hello", "Q: ok?"]:
        ids = tok.encode(prompt)
        first = oracle(model, ids)[-1]
        a, d = (int(t) for t in np.argsort(-first)[:2])
        after = oracle(model, ids + [a])[-1]
        b1, b2 = (int(t) for t in np.argsort(-after)[:2])
        labels = [tok.decode([a, b1]), tok.decode([a, b2]), tok.decode([d])]
        if any(t < 3 for t in (a, b1, b2, d)) or len(set(labels)) < 3:
            continue  # a special token: not a text label
        scores = [first[a] + after[b1], first[a] + after[b2], first[d]]
        if not scores[2] > max(scores[:2]):
            continue
        assert first[a] > first[d]  # what greedy decoding would start with
        _, outs = run(model, [(("greedy", 0), ids, SamplingParams(
            max_tokens=4, structured_outputs=StructuredOutput.make("choice", labels)))])
        (out,) = outs[("greedy", 0)]
        assert out.text == labels[2]
        check_row(model, tok, ids, [out], labels)
        found += 1
    assert found >= 1


def test_chi_square_of_2000_draws_against_choice_probs(model):
    """2,000 seeded temperature-1 samples of one prompt (two rows of n = 1000; sample ``i``
    draws with sample ``i``'s seed): the label frequencies fit ``choice_probs`` (chi-square,
    p > 0.01). The labels are the prompt's four most likely first tokens, each continued by
    its own most likely second token (two-token labels of similar probabilities: every
    expected count stays above 10)."""
    tok = byte_tokenizer()
    ids = tok.encode("Pick one:")
    top = [int(t) for t in np.argsort(-oracle(model, ids)[-1]) if t >= 3][:4]
    labels = [tok.decode([t, next(int(u) for u in np.argsort(-oracle(model, ids + [t])[-1])
                                  if u >= 3)]) for t in top]
    so = StructuredOutput.make("choice", labels)
    items = [(s, ids, SamplingParams(max_tokens=4, n=1000, seed=s, temperature=1.0,
                                     structured_outputs=so)) for s in (1, 2)]
    eng, outs = run(model, items, EngineConfig(block_size=8, num_blocks=64))
    samples = outs[1] + outs[2]
    assert len(samples) == 2000 and eng.counters.num_steps <= 5  # scored once per row
    probs = [samples[0].choice_probs[c] for c in labels]
    assert min(probs) * 2000 > 10  # every expected count well above chi-square's 5
    stat, df = chi_square([sum(o.text == c for o in samples) for c in labels], probs)
    assert df == 3 and chi2_sf(stat, df) > 0.01, (stat, probs)
    assert len({o.text for o in outs[1]}) == len(labels)


def test_cost_is_one_prefill_plus_the_labels_tokens(model):
    """No step samples a token for a choice row; the tokens computed are each row's prompt
    (less its prefix-cache hit) plus the tokens of its labels of two or more tokens, which
    fork the prompt's blocks (so the prompt's partial last block is not recomputed)."""
    tok = byte_tokenizer()
    labels = ["good", "bad!", "g", "meh"]
    so = StructuredOutput.make("choice", labels)
    prompts = ["a review of a kettle: it works", "a review of a tent: it leaks", "short"]
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=128), model, tok)
    computed, sampled, steps = 0, 0, eng.scheduler.schedule

    def counting():
        nonlocal computed, sampled
        out = steps()
        computed += out.total_num_scheduled_tokens
        sampled += sum(out.sampling)
        return out

    eng.scheduler.schedule = counting
    outs = list(eng.generate(EngineRequest(str(i), tok.encode(p), SamplingParams(
        max_tokens=8, structured_outputs=so)) for i, p in enumerate(prompts)))
    assert sampled == 0 and len(outs) == 3
    multi = sum(len(c) for c in labels if len(c) > 1)
    assert computed == sum(o.num_prompt_tokens - o.num_cached_tokens for o in outs) + 3 * multi
    by_id = {int(o.request_id): o for o in outs}
    assert by_id[1].num_cached_tokens == 8  # "a review of a " fills one block of 8
    assert eng.counters.generation_tokens == sum(len(o.token_ids) for o in outs)
    assert eng.counters.peak_kv_blocks > 0 and eng.counters.kv_tokens_held > 0


def test_max_tokens_cuts_the_label_and_stop_fields_do_not(model):
    """``max_tokens`` below the label's length cuts it (``length``); ``stop``,
    ``stop_token_ids``, ``min_tokens`` and ``ignore_eos`` leave a whole label."""
    tok = byte_tokenizer()
    so = StructuredOutput.make("choice", ["bad!"])
    ids = tok.encode("hi")
    items = [("cut", ids, SamplingParams(max_tokens=2, structured_outputs=so, logprobs=0)),
             ("zero", ids, SamplingParams(max_tokens=0, structured_outputs=so)),
             ("stops", ids, SamplingParams(max_tokens=9, min_tokens=9, stop=["a"],
                                           stop_token_ids=tok.encode("d"), ignore_eos=True,
                                           structured_outputs=so))]
    _, outs = run(model, items)
    (cut,), (zero,), (stops,) = outs["cut"], outs["zero"], outs["stops"]
    assert (cut.text, cut.finish_reason, cut.token_ids) == ("ba", "length", tok.encode("ba"))
    assert len(cut.logprobs) == 2 and cut.choice_probs == {"bad!": 1.0}
    assert (zero.text, zero.finish_reason, zero.token_ids) == ("", "length", [])
    assert zero.choice_logprobs is not None
    assert (stops.text, stops.finish_reason) == ("bad!", "stop")


# ------------------------------------------------------------------ where labels end


def test_labels_join_the_prompt_end_as_the_tokenizer_does(model):
    """A BPE tokenizer with the tokens " r" .. " red" and " g" .. " green" (by hand): after
    "Pick a colour: ", which ends with the token " ", label "red" is written " red", one
    token that takes over the prompt's " "; " green" (given with its space) leaves the
    prompt's " " alone ("colour:  green" is ":" " " " green"). Both are scored from before
    the " " (one context for every label): "red" as " red", " green" as " " " green";
    without the prompt's space, "red" is "r" "e" "d". Scores are the teacher-forced sums
    from that position."""
    tok = merged_tokenizer()
    sp, red, green = (tok.encode(t, add_special_tokens=False) for t in (" ", " red", " green"))
    assert len(sp) == len(red) == len(green) == 1
    ids = tok.encode("Pick a colour: ")
    assert ids[-1:] == sp
    joined = LabelJoiner(tok).join(ids, ["red", " green"])
    assert joined.start == len(ids) - 1
    assert joined.tokens == (tuple(red), tuple(sp + green))
    assert LabelJoiner(tok).join(ids[:-1], ["red", " green"]) == (len(ids) - 1, (
        tuple(tok.encode("red", add_special_tokens=False)), tuple(green)))
    so = StructuredOutput.make("choice", ["red", " green"])
    _, outs = run(model, [("r", ids, SamplingParams(max_tokens=4, structured_outputs=so))], tok=tok)
    (out,) = outs["r"]
    context = ids[:-1]
    want = {"red": sum(teacher_forced(model, context, red)),
            " green": sum(teacher_forced(model, context, sp + green))}
    for c, v in want.items():
        assert abs(out.choice_logprobs[c] - v) < 1e-3
    assert out.text == max(want, key=want.get)
    assert out.token_ids == (red if out.text == "red" else sp + green)


def test_token_ids_that_do_not_round_trip_fall_back_to_the_labels_own_tokens():
    """A prompt given as ids the tokenizer would not produce (" r" + "e" + "d" where " red"
    is one token) is not re-encoded across them: the suffix that round-trips is used, and
    with none the label's own encoding is appended."""
    tok = merged_tokenizer()
    r, e, d = (tok.encode(t, add_special_tokens=False) for t in (" r", "e", "d"))
    ids = r + e + d
    joined = LabelJoiner(tok).join(ids, ["!", "?"])
    assert joined.start == len(ids)
    assert joined.tokens == tuple(tuple(tok.encode(c, add_special_tokens=False))
                                  for c in ("!", "?"))


def test_labels_that_tokenize_the_same_are_refused(model):
    """The byte tokenizer maps every character outside its vocabulary to one id, so "€" and
    "™" are the same tokens: the row fails alone, naming the field; the same labels are a
    validation problem with file, line and field; labels given twice never parse."""
    tok = byte_tokenizer()
    assert tok.encode("€", add_special_tokens=False) == tok.encode("™",
                                                                   add_special_tokens=False)
    so = StructuredOutput.make("choice", ["€", "™", "ok"], source="guided_choice")
    fine = StructuredOutput.make("choice", ["yes", "no"])
    _, outs = run(model, [("bad", tok.encode("hi"), SamplingParams(structured_outputs=so)),
                          ("fine", tok.encode("hi"), SamplingParams(structured_outputs=fine))])
    (bad,), (ok,) = outs["bad"], outs["fine"]
    assert bad.finish_reason == "abort" and bad.error == (
        'field "guided_choice": labels "€" and "™" are the same tokens after the prompt ([0])')
    assert ok.error is None and ok.text in ("yes", "no")
    with pytest.raises(ValueError, match='label "a" is given twice'):
        StructuredOutput.make("choice", ["a", "b", "a"])

    from mlxpa.batch.prompts import row_prompt
    from mlxpa.inputs import InputProcessor
    from mlxpa.structured.labels import choice_label_checker

    rows = [Row(0, 0, "hi", None, {"structured_outputs": so}, line=1),
            Row(1, 1, "hi", None, {}, line=2),
            Row(2, 2, "hi", None, {"structured_outputs": fine}, line=3)]
    check = choice_label_checker(
        lambda: tok, lambda row, t: InputProcessor(t).prompt_token_ids(row_prompt(row)),
        StructuredOutput.make("choice", ["™", "€"], source="--choice"))
    v = validate(rows, source="in.jsonl", unit="line", check_prompt=check)
    assert v.problems == [
        'in.jsonl line 1: field "guided_choice": labels "€" and "™" are the same tokens '
        "after the prompt ([0])",
        'in.jsonl line 2: --choice: labels "™" and "€" are the same tokens after the prompt '
        "([0])"]
    assert not v.constrained  # choice rows need no grammar


def test_choice_rows_build_no_grammar(model):
    """A choice-only run never creates a matcher nor waits for llguidance's tokenizer."""
    tok = byte_tokenizer()
    so = StructuredOutput.make("choice", ["yes", "no"])
    eng, outs = run(model, [(i, tok.encode("q" * i), SamplingParams(structured_outputs=so))
                            for i in range(1, 4)])
    assert len(outs) == 3 and eng.runner.grammars._ll is None
    assert eng.counters.mask_steps == 0 and VOCAB == eng.runner.vocab_size
