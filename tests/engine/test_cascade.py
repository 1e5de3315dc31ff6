"""Cascade attention end to end on tiny models: every step's logits with cascade attention on
are those with it off (within 1e-4, float32), so the greedy tokens are identical, over groups
of 2 to 128 rows (decode rows, and prefill chunks over a prefix cached by an earlier step),
shared prompt prefixes ending on and off a block boundary, sliding-window
layers (Gemma 3) whose windows reach into the prefix, forks (``n > 1``) and preemption in a
tiny pool. The cost rule is set to accept every group here (the tiny models' groups would not
pay on real hardware), and the tests check that cascade attention ran, at which group sizes
and in which layer kinds.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import attention, cascade
from mlxpa.worker.sampler import Sampler
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

BS = 8
RNG = np.random.default_rng(0)
DOC_OFF = RNG.integers(3, 250, 37).tolist()      # 4 full blocks + 5 tokens
DOC_ON = RNG.integers(3, 250, 32).tolist()       # exactly 4 blocks


def _prompts(doc: list[int], count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [doc + rng.integers(3, 250, int(rng.integers(1, 12))).tolist() for _ in range(count)]


@pytest.fixture
def spies(monkeypatch):
    """Every group kept; records each step's (requests, logits) and each cascade call's
    group sizes, window and query length (1: decode rows; more: prefill chunks)."""
    monkeypatch.setattr(cascade, "worth_cascading", lambda rows, blocks: True)
    steps, calls = [], []
    sample, attend = Sampler.sample, attention.cascade_attention

    def sample_spy(self, logits, reqs, *args, **kwargs):
        steps.append(([(r.request_id, r.sample_index) for r in reqs],
                      np.array(logits[0].astype(mx.float32))))
        return sample(self, logits, reqs, *args, **kwargs)

    def attend_spy(q, kv, prefix, **kwargs):
        sizes = (np.array(prefix.row_slot)[:, None] // prefix.rows.shape[1]
                 == np.arange(prefix.rows.shape[0])[None]).sum(axis=0)
        calls.append((tuple(sorted(sizes.tolist())), kv.sliding_window, q.shape[2]))
        return attend(q, kv, prefix, **kwargs)

    monkeypatch.setattr(Sampler, "sample", sample_spy)
    monkeypatch.setattr(attention, "cascade_attention", attend_spy)
    return steps, calls


def _run(model, items, steps, **config):
    """Run ``items`` to completion; returns (tokens per (id, sample), the steps recorded,
    the engine)."""
    cfg = dict(block_size=BS, num_blocks=600, max_num_seqs=128, max_num_batched_tokens=256)
    engine = LLMEngine(EngineConfig(**{**cfg, **config}), model, byte_tokenizer(eos_id=-1))
    first = len(steps)
    outs = list(engine.generate(items))
    engine.kv_cache_manager.check_invariants([])
    tokens = {(o.request_id, o.sample_index): o.token_ids for o in outs}
    return tokens, steps[first:], engine


def _compare(model, items, spies, **config):
    steps, calls = spies
    on, steps_on, engine = _run(model, items, steps, **config)
    ran = list(calls)
    calls.clear()
    off, steps_off, _ = _run(model, items, steps, disable_cascade_attn=True, **config)
    assert not calls                                   # off means off
    assert on == off
    assert len(steps_on) == len(steps_off)
    worst = 0.0
    for (reqs_a, logits_a), (reqs_b, logits_b) in zip(steps_on, steps_off):
        assert reqs_a == reqs_b
        worst = max(worst, float(np.abs(logits_a - logits_b).max()))
    assert worst <= 1e-4, worst
    return ran, engine


def _items(prompts: list[list[int]], max_tokens: int = 12, n: dict | None = None):
    n = n or {}
    return [EngineRequest(str(i), p, SamplingParams(max_tokens=max_tokens, n=n.get(i, 1)))
            for i, p in enumerate(prompts)]


def test_llama_groups_on_and_off_block_boundaries_with_forks(spies):
    prompts = (_prompts(DOC_OFF, 40, 1) + _prompts(DOC_ON, 3, 2) + _prompts(DOC_ON[:9], 2, 3)
               + [RNG.integers(3, 250, 20).tolist()])
    ran, _ = _compare(tiny_llama(), _items(prompts, n={41: 3, 44: 2}), spies)
    sizes = Counter(s for group_sizes, _, length in ran if length == 1 for s in group_sizes)
    assert max(sizes) == 40 and 2 in sizes and 5 in sizes   # 3 + 3 samples (1 forked twice)
    # The prompts after the first of each document prefill over its cached blocks in groups.
    assert any(length > 1 for _, _, length in ran)


def test_llama_one_group_of_128(spies):
    ran, _ = _compare(tiny_llama(), _items(_prompts(DOC_ON, 128, 4), max_tokens=6), spies)
    assert any(sizes == (128,) for sizes, _, length in ran if length == 1)


def test_gemma3_sliding_windows_reach_into_the_prefix(spies):
    # A 24-token window: early decode steps see part of the 4-5 shared blocks.
    prompts = _prompts(DOC_OFF, 6, 5) + _prompts(DOC_ON, 4, 6)
    ran, _ = _compare(tiny_gemma3(sliding_window=24), _items(prompts, n={7: 2}), spies)
    assert {w for _, w, _ in ran} == {None, 24}
    assert {w for _, w, length in ran if length > 1} == {None, 24}
    # In window layers members leave the group as their windows pass the prefix.
    assert Counter(sizes for sizes, w, _ in ran if w == 24) != Counter(
        sizes for sizes, w, _ in ran if w is None)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_preemption_in_a_tiny_pool(spies, kind):
    model = tiny_llama() if kind == "llama" else tiny_gemma3(sliding_window=24)
    prompts = _prompts(DOC_OFF, 8, 7) + _prompts(DOC_ON, 4, 8)
    ran, engine = _compare(model, _items(prompts, max_tokens=24, n={9: 2}), spies,
                           num_blocks=40, max_num_batched_tokens=64)
    assert engine.counters.num_preemptions > 0
    assert ran


def test_default_cost_rule_keeps_tiny_groups_plain(monkeypatch):
    """Without the test's rule, groups of a few rows sharing 4 blocks never pay: the step
    runs plain attention (and the same tokens)."""
    calls = []
    monkeypatch.setattr(attention, "cascade_attention",
                        lambda *a, **k: calls.append(1))
    prompts = _prompts(DOC_ON, 4, 9)
    engine = LLMEngine(EngineConfig(block_size=BS, num_blocks=200), tiny_llama(),
                       byte_tokenizer(eos_id=-1))
    outs = list(engine.generate(_items(prompts, max_tokens=4)))
    assert len(outs) == 4 and not calls
