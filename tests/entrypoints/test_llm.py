"""``LLM.generate`` and ``LLM.chat`` on a tiny random llama, against independent oracles:
mlx-lm's own generation on the same folder (``mlx_lm.generate``, ``generate_step``), the
chat template rendered by the tokenizer itself, a float64 log-softmax of mlx-lm's logits
(vLLM's logprobs: value, rank, decoded token), the teacher-forced choice sums, and
``mlxpa run`` on the same rows as a file (identical texts and token ids)."""

from __future__ import annotations

import json
import time

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import generate as mlx_lm_generate
from mlx_lm.generate import generate_step

from mlxpa import (
    CompletionOutput,
    Logprob,
    RequestOutput,
    SamplingParams,
    StructuredOutputsParams,
)
from mlxpa.batch import job
from mlxpa.batch.run import RunOptions, run_file
from mlxpa.config import EngineConfig
from tests.entrypoints.conftest import KV_BYTES

PROMPTS = ["the cat sat on the mat", "a", "hello world, hello world, hello", "0123456789"]
EOS = 1


def log_softmax64(model, ids: list[int]) -> np.ndarray:
    """``[len(ids), V]`` float64 log-softmax of mlx-lm's logits (row ``p`` predicts
    token ``p + 1``)."""
    x = np.array(model(mx.array(ids)[None])[0].astype(mx.float32), dtype=np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def greedy_ids(model, ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's greedy tokens, through the first EOS (kept, as mlxpa's token_ids keep it)."""
    out = []
    for t, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        out.append(int(t))
        if out[-1] == EOS:
            break
    return out


def test_greedy_generate_equals_mlx_lm(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12), use_tqdm=False)
    assert [type(o) for o in outs] == [RequestOutput] * len(PROMPTS)
    for i, (prompt, out) in enumerate(zip(PROMPTS, outs)):
        assert (out.request_id, out.prompt, out.finished) == (str(i), prompt, True)
        assert out.prompt_token_ids == tok.encode(prompt) and out.prompt_logprobs is None
        (c,) = out.outputs
        assert isinstance(c, CompletionOutput) and c.index == 0 and c.finished()
        assert c.token_ids == greedy_ids(model, tok.encode(prompt), 12)
        assert c.text == mlx_lm_generate(model, tok, prompt, max_tokens=12)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length")
        assert (c.cumulative_logprob, c.logprobs, c.stop_reason, c.choice_logprobs) == (
            None, None, None, None)


def test_a_single_prompt_token_ids_and_tokens_prompts(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    ids = tok.encode(PROMPTS[0])
    want = greedy_ids(model, ids, 6)
    params = SamplingParams(max_tokens=6)
    (text,) = llm.generate(PROMPTS[0], params, use_tqdm=False)
    (one,) = llm.generate(ids, params, use_tqdm=False)  # a list of ints is one prompt
    two = llm.generate([ids, {"prompt_token_ids": ids}], params, use_tqdm=False)
    for out in (text, one, *two):
        assert out.outputs[0].token_ids == want and out.prompt_token_ids == ids
    assert one.prompt is None and text.prompt == PROMPTS[0]


def test_per_prompt_sampling_params_and_dict_rows_with_their_fields(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    ref = [greedy_ids(model, tok.encode(p), 10) for p in PROMPTS]
    outs = llm.generate(PROMPTS[:3], [SamplingParams(max_tokens=3), SamplingParams(max_tokens=7),
                                      SamplingParams(max_tokens=10)], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [ref[0][:3], ref[1][:7], ref[2][:10]]
    rows = [{"id": "short", "prompt": PROMPTS[0], "max_tokens": 2},  # overrides the 10
            {"prompt": PROMPTS[2]},                                  # takes the 10
            {"id": 7, "prompt": PROMPTS[3], "max_tokens": 5, "ignore_eos": True}]
    outs = llm.generate(rows, SamplingParams(max_tokens=10), use_tqdm=False)
    assert [o.request_id for o in outs] == ["short", "1", "7"]
    assert outs[0].outputs[0].token_ids == ref[0][:2]
    assert outs[1].outputs[0].token_ids == ref[2]
    no_eos = [int(t) for t, _ in generate_step(mx.array(tok.encode(PROMPTS[3])), model,
                                                max_tokens=5)]
    assert outs[2].outputs[0].token_ids == no_eos


def test_seeded_samples_do_not_depend_on_the_batch(llm):
    """A prompt's samples are the same alone and among others (per-request seeds)."""
    hot = SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    alone = llm.generate(PROMPTS[1], hot, use_tqdm=False)[0].outputs[0].token_ids
    batch = llm.generate(PROMPTS, [SamplingParams(max_tokens=4), hot, SamplingParams(),
                                   SamplingParams(max_tokens=2)], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone


def test_n_samples_are_completion_outputs_with_their_index(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    (greedy,) = llm.generate(PROMPTS[0], SamplingParams(max_tokens=5, n=3), use_tqdm=False)
    assert [c.index for c in greedy.outputs] == [0, 1, 2]
    assert all(c.token_ids == greedy_ids(model, tok.encode(PROMPTS[0]), 5)
               for c in greedy.outputs)
    (hot,) = llm.generate({"prompt": PROMPTS[0], "n": 4, "temperature": 1.0},
                          SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [c.index for c in hot.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in hot.outputs}) > 1  # distinct seeds per sample


def test_chat_equals_the_template_rendered_then_mlx_lm(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    conv = [{"role": "user", "content": "name a colour"}]
    convs = [conv, [{"role": "system", "content": "be brief"}, *conv]]
    outs = llm.chat(convs, SamplingParams(max_tokens=8), use_tqdm=False)
    for c, out in zip(convs, outs):
        text = tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
        assert out.prompt == text and out.prompt_token_ids == tok.encode(text)
        assert out.outputs[0].text == mlx_lm_generate(model, tok, text, max_tokens=8)
    (styled,) = llm.chat(conv, SamplingParams(max_tokens=8), use_tqdm=False,
                         chat_template_kwargs={"style": "terse"})
    text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False,
                                   style="terse")
    assert styled.prompt == text and text.endswith("[terse] assistant:")
    assert styled.outputs[0].text == mlx_lm_generate(model, tok, text, max_tokens=8)
    (bare,) = llm.chat(conv, SamplingParams(max_tokens=2), use_tqdm=False,
                       add_generation_prompt=False)
    assert bare.prompt == tok.apply_chat_template(conv, add_generation_prompt=False,
                                                  tokenize=False)


def test_logprobs_in_vllms_shape_against_a_float64_log_softmax(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    k = 3
    (out,) = llm.generate(PROMPTS[0], SamplingParams(max_tokens=6, logprobs=k, temperature=0.8,
                                                     seed=2), use_tqdm=False)
    c = out.outputs[0]
    prompt = tok.encode(PROMPTS[0])
    lp = log_softmax64(model, prompt + c.token_ids)
    assert len(c.logprobs) == len(c.token_ids)
    ranks = []
    for j, (token, entries) in enumerate(zip(c.token_ids, c.logprobs)):
        row = lp[len(prompt) - 1 + j]
        top = list(np.argsort(-row)[:k])
        assert set(entries) == {token, *top} and len(entries) in (k, k + 1)
        for tid, entry in entries.items():
            assert isinstance(entry, Logprob)
            assert entry.logprob == pytest.approx(row[tid], abs=1e-4)
            assert (row > row[tid] + 1e-5).sum() < entry.rank <= (row >= row[tid] - 1e-5).sum()
            assert entry.decoded_token == tok.decode([tid])
        ranks.append(entries[token].rank)
    assert max(ranks) > 1  # sampled at temperature 0.8: not always the most likely
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in
                                                     zip(c.token_ids, c.logprobs)))
    (zero,) = llm.generate(PROMPTS[0], SamplingParams(max_tokens=3, logprobs=0),
                           use_tqdm=False)
    assert [list(e) for e in zero.outputs[0].logprobs] == [[t] for t in zero.outputs[0].token_ids]
    assert all(e[t].rank == 1 for t, e in zip(zero.outputs[0].token_ids,
                                               zero.outputs[0].logprobs))  # greedy


def test_choice_logprobs_are_the_teacher_forced_sums(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    labels = ["yes", "no", "maybe"]
    params = SamplingParams(max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=labels))
    outs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        c = out.outputs[0]
        assert c.text in labels and c.finish_reason == "stop"
        ids = tok.encode(prompt)
        for label in labels:
            full = ids + tok.encode(label)
            lp = log_softmax64(model, full)
            want = sum(lp[p - 1, full[p]] for p in range(len(ids), len(full)))
            assert c.choice_logprobs[label] == pytest.approx(want, abs=1e-3)


def test_a_prompt_that_fails_while_running_loses_no_other_prompts_work(folder, mlx_lm_model):
    from mlxpa import LLM

    model, tok = mlx_lm_model
    small = LLM(folder, kv_cache_memory_bytes=2**17, block_size=16)  # 16 blocks: 256 tokens
    prompts = [PROMPTS[0], "x" * 300, PROMPTS[1]]
    outs = small.generate(prompts, SamplingParams(max_tokens=4), use_tqdm=False)
    assert outs[1].error == ("prompts[1]: prompt has 300 tokens; the limit is 255 (the KV pool "
                             "holds 256 tokens)")
    assert [c.finish_reason for c in outs[1].outputs] == ["abort"]
    for i in (0, 2):
        assert outs[i].error is None
        assert outs[i].outputs[0].token_ids == greedy_ids(model, tok.encode(prompts[i]), 4)


def test_generate_equals_mlxpa_run_on_the_same_rows(tmp_path, folder, monkeypatch):
    """The same rows as a JSONL file through ``mlxpa run`` and as dicts through a fresh
    ``LLM.generate`` (the same batches, an empty prefix cache): identical texts, token ids,
    finish reasons, logprobs, choice scores."""
    from mlxpa import LLM

    rows = [{"id": "t", "prompt": PROMPTS[0], "max_tokens": 6, "logprobs": True,
             "top_logprobs": 2},
            {"id": "s", "prompt": PROMPTS[2], "temperature": 0.9, "n": 2},
            {"id": "c", "prompt": PROMPTS[1], "guided_choice": ["up", "down"]},
            {"id": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a"]},
            {"id": "k", "prompt_token_ids": [40, 41, 42, 43], "max_tokens": 3}]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    file_ids = {}
    records = job.result_records

    def spy(row, outs, *args, **kwargs):  # the file run's token ids (its records hold counts)
        file_ids[row.id] = [o.token_ids for o in outs]
        return records(row, outs, *args, **kwargs)

    monkeypatch.setattr(job, "result_records", spy)
    defaults = SamplingParams(max_tokens=8)
    run_file(str(src), str(out), EngineConfig(model=folder, kv_cache_memory_bytes=KV_BYTES),
             defaults, RunOptions(show_progress=False))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    api = LLM(folder, kv_cache_memory_bytes=KV_BYTES).generate(rows, defaults, use_tqdm=False)
    got = [(o.request_id, c) for o in api for c in o.outputs]
    assert [(r["id"], r.get("sample_index", 0)) for r in written] == [
        (rid, c.index) for rid, c in got] == [("t", 0), ("s", 0), ("s", 1), ("c", 0),
                                              ("m", 0), ("k", 0)]
    for record, (rid, c) in zip(written, got):
        assert (record["text"], record["finish_reason"]) == (c.text, c.finish_reason)
        assert file_ids[rid][c.index] == c.token_ids
        assert record.get("choice_logprobs") == c.choice_logprobs
    c = api[0].outputs[0]
    assert len(written[0]["logprobs"]) == len(c.token_ids)
    for entry, token, position in zip(written[0]["logprobs"], c.token_ids, c.logprobs):
        assert entry["logprob"] == position[token].logprob
        top = sorted((e for e in position.values() if e.rank <= 2), key=lambda e: e.rank)
        assert [t["logprob"] for t in entry["top_logprobs"]] == [e.logprob for e in top]


SEGMENT = 4 * 8192  # 4 blocks of the tiny llama (8 KiB a block)


def test_the_kv_pool_grows_in_place_to_each_call_in_segments(folder):
    """The pool starts at one segment; a call grows it at once, by whole segments, to what
    its prompts can use (1 + Σ n·⌈(prompt + max_tokens) / block⌉, as ``mlxpa run`` sizes its
    pool), in place: the same engine, runner, manager and prefix cache; a stream grows it as
    its steps need blocks; at most the budget."""
    from mlxpa import LLM

    llm = LLM(folder, kv_cache_memory_bytes=KV_BYTES, kv_segment_bytes=SEGMENT,
              kv_release_after=-1)
    engine, runner = llm.llm_engine, llm.llm_engine.runner
    kv = engine.kv_cache_manager
    assert runner.num_blocks == kv.pool.num_blocks == 4  # one segment before a call
    assert kv.pool.max_num_blocks == runner.budget_blocks == KV_BYTES // runner.block_bytes + 1
    params = SamplingParams(max_tokens=8)
    llm.generate("x" * 40, params, use_tqdm=False)
    assert runner.num_blocks == 4  # 48 tokens: 3 blocks of 16 and the null block
    (again,) = llm.generate("x" * 33, params, use_tqdm=False)
    assert again.num_cached_tokens == 32  # two full blocks
    llm.generate(["x" * 40, "y" * 40], params, use_tqdm=False)
    assert runner.num_blocks == 8  # 1 + 2 * 3 blocks: two segments
    assert (llm.llm_engine, engine.runner, engine.kv_cache_manager) == (engine, runner, kv)
    (again,) = llm.generate("x" * 33, params, use_tqdm=False)
    assert again.num_cached_tokens == 32  # the prefix cache kept while the pool grew
    list(llm.generate_iter(["z" * 100] * 3, params))  # each its own 7 blocks: grown by steps
    assert 8 < runner.num_blocks < kv.pool.max_num_blocks and runner.num_blocks % 4 == 0
    kv.check_invariants([])


def test_an_idle_llm_gives_its_kv_pool_back_between_calls(folder, mlx_lm_model):
    """``kv_release_after`` seconds after a call, the LLM's release thread shrinks the pool
    to one segment, keeping the most recently used cached blocks that fit; the next call
    grows it again, hits a kept prefix and gives the oracle's tokens."""
    from mlxpa import LLM

    model, tok = mlx_lm_model
    llm = LLM(folder, kv_cache_memory_bytes=KV_BYTES, kv_segment_bytes=SEGMENT,
              kv_release_after=0.2)
    engine, runner = llm.llm_engine, llm.llm_engine.runner
    params = SamplingParams(max_tokens=4)
    prompts = ["the cat sat on the mat " * 2, "x" * 30, "hello world, " * 5]
    first = llm.generate(prompts, params, use_tqdm=False)
    grown = runner.num_blocks
    assert grown > 4
    deadline = time.monotonic() + 20
    while runner.num_blocks > 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner.num_blocks == engine.kv_cache_manager.pool.num_blocks == 4
    assert runner.kv_cache.key_caches[0].shape[0] == 4
    engine.kv_cache_manager.check_invariants([])
    assert engine.kv_cache_manager.tree.total_blocks == 3  # what fits in one segment
    again = llm.generate(prompts, params, use_tqdm=False)
    assert sum(o.num_cached_tokens for o in again) >= 16  # a kept block is a prefix's first
    for out in again:
        assert out.outputs[0].token_ids == greedy_ids(model, tok.encode(out.prompt), 4)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]


def test_prompt_logprobs_in_vllms_shape_against_a_float64_log_softmax(llm, mlx_lm_model):
    """``SamplingParams(prompt_logprobs=k)`` (and a row's field) fill
    ``RequestOutput.prompt_logprobs`` as vLLM does: None for the first prompt token, then per
    token a dict holding it (its value and rank) and the ``k`` most likely tokens there;
    exact on a second call while the prefix cache holds the prompt, and one list per prompt
    whatever ``n``."""
    model, tok = mlx_lm_model
    k = 2
    prompt = PROMPTS[0] * 4  # 88 tokens: full blocks the prefix cache keeps
    ids = tok.encode(prompt)
    lp = log_softmax64(model, ids)
    params = SamplingParams(max_tokens=2, prompt_logprobs=k)
    first, row = llm.generate([prompt, {"prompt": prompt, "prompt_logprobs": k, "n": 2,
                                        "temperature": 1.0, "max_tokens": 1}], params,
                              use_tqdm=False)
    (again,) = llm.generate(prompt, params, use_tqdm=False)
    for out in (first, row, again):
        got = out.prompt_logprobs
        assert len(got) == len(ids) and got[0] is None
        for p in range(1, len(ids)):
            entries, want = got[p], lp[p - 1]
            top = list(np.argsort(-want)[:k])
            assert set(entries) == {ids[p], *top}, p
            for tid, entry in entries.items():
                assert entry.logprob == pytest.approx(want[tid], abs=1e-4)
                assert entry.decoded_token == tok.decode([tid])
            rank = entries[ids[p]].rank
            assert (want > want[ids[p]] + 1e-5).sum() < rank <= (want >= want[ids[p]] - 1e-5).sum()
    (plain,) = llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)
    assert plain.prompt_logprobs is None


def test_choice_rows_carry_choice_probs_and_the_outside_mass(llm):
    """A choice row's ``CompletionOutput`` carries what a file row's output carries:
    ``choice_probs`` (softmax of ``choice_logprobs``, float64 oracle: they sum to 1, the
    text is their argmax at temperature 0) and ``choice_outside_prob`` (``1 - sum(exp)``
    over disjoint labels); other rows have None."""
    labels = ["yes", "no", "maybe"]
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=labels))
    choice, plain = llm.generate([PROMPTS[0], {"prompt": PROMPTS[1], "max_tokens": 2}],
                                 [params, SamplingParams()], use_tqdm=False)
    c = choice.outputs[0]
    lp = np.array([c.choice_logprobs[label] for label in labels], np.float64)
    want = np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum()
    assert list(c.choice_probs) == labels
    np.testing.assert_allclose([c.choice_probs[label] for label in labels], want, rtol=1e-12)
    assert c.text == labels[int(np.argmax(want))]
    assert c.choice_outside_prob == pytest.approx(1 - np.exp(lp).sum(), abs=1e-12)
    p = plain.outputs[0]
    assert p.choice_logprobs is None and p.choice_probs is None and p.choice_outside_prob is None
