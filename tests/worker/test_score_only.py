"""``score_only`` requests (what a choice row runs as) through the real scheduler, KV cache
manager and model runner, against a float64 oracle (the log-softmax of mlx-lm's own forward
pass): a request samples nothing, reads its ``target_token_ids`` (with ``scored_top_logprobs``
alternatives) from its last prompt token's logits, and finishes after its prefill; a
request whose prompt extends its parent's forks the parent's blocks, computes only its own
tokens (copy-on-write of the shared partial block) and scores them exactly."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request, RequestStatus
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.model_runner import ModelRunner
from tests.tiny_models import tiny_gemma3, tiny_llama
from tests.worker.test_logprobs import oracle

BS = 8
PROMPT = [(5 * i * i + 11 * i + 2) % 250 + 3 for i in range(21)]  # 2 full blocks + 5
EXTRA = [40, 41, 42, 43]
TARGETS = (7, 40, 200, 7)  # a repeated id is read twice
TOP = 4


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)


def engine_parts(model, **kw):
    config = EngineConfig(block_size=BS, num_blocks=32, **kw)
    runner = ModelRunner(model, config)
    runner.allocate_kv_cache(runner.budget_blocks)
    kv = KVCacheManager(BlockPool(runner.num_blocks, BS), True, runner.kv_cache_layout)
    return runner, kv, Scheduler(config, kv, runner.max_model_len)


@pytest.mark.parametrize("budget", [2048, 6], ids=["one-prefill", "chunked"])
def test_targets_with_alternatives_and_no_sample(model, budget):
    runner, kv, sched = engine_parts(model, max_num_batched_tokens=budget)
    req = Request("p", list(PROMPT), SamplingParams(max_tokens=5), score_only=True,
                  target_token_ids=TARGETS, scored_top_logprobs=TOP)
    sched.add_request(req)
    targets, steps = {}, 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        assert not any(out.sampling)  # never an LM-head row to sample
        result = runner.execute(out)
        assert result.sampled == [] and result.logprobs == {}
        targets.update(result.targets)
        assert sched.update_from_output(out, result.sampled) == []
        steps += 1
    assert steps == (1 if budget > len(PROMPT) else -(-len(PROMPT) // budget))
    assert req.status == RequestStatus.FINISHED_STOPPED and req.output_token_ids == []
    row = oracle(model, PROMPT)[-1]
    got = targets[req.key]
    assert [v.token_id for v in got] == list(TARGETS)
    for v in got:
        assert abs(v.logprob - row[v.token_id]) < 1e-4
        assert [t for t, _ in v.top] == list(np.argsort(-row)[:TOP])
        assert all(abs(lp - row[t]) < 1e-4 for t, lp in v.top)
    runner.execute(sched.schedule())  # frees the finished request's runner state
    kv.check_invariants([])


def test_forks_extending_the_prompt_compute_only_their_own_tokens(model):
    """The parent (21 prompt tokens: blocks 0-1 full, block 2 holds 5) is forked into two
    children whose prompts add 4 and 3 tokens; the parent finishes in the same step. Each
    child starts at position 21 on the parent's blocks and computes only its own tokens;
    the shared partial block is copied once (by the first child to write into it; the
    second then holds the original alone), and every scored token matches the oracle."""
    runner, kv, sched = engine_parts(model)
    parent = Request("p", list(PROMPT), SamplingParams(max_tokens=1), score_only=True,
                     target_token_ids=(EXTRA[0], 99))
    children = [Request(f"c{len(x)}", PROMPT + x, SamplingParams(max_tokens=1),
                        score_only=True, num_scored_tokens=len(x) - 1, scored_top_logprobs=2)
                for x in (EXTRA, [99, 98, 97])]
    sched.add_request(parent)
    out = sched.schedule()
    result = runner.execute(out)
    first = result.targets[parent.key]
    sched.add_samples(parent, children)
    for child in children:
        assert child.num_computed_tokens == len(PROMPT)
        assert child.block_tables[0] == parent.block_tables[0]  # every prompt block shared
    sched.update_from_output(out, result.sampled)
    assert parent.is_finished and not any(c.is_finished for c in children)
    out = sched.schedule()
    assert out.requests == children and out.num_scheduled_tokens == [4, 3]
    assert len(out.blocks_to_copy) == len(runner.kv_cache_layout.groups)  # once per group
    result = runner.execute(out)
    sched.update_from_output(out, result.sampled)
    assert all(c.is_finished for c in children) and result.sampled == []
    for child, (t0, t0_lp) in zip(children, zip((EXTRA[0], 99), first)):
        ids = child.prompt_token_ids
        ref = oracle(model, ids)
        assert t0_lp.token_id == t0 == ids[len(PROMPT)]
        assert abs(t0_lp.logprob - ref[len(PROMPT) - 1][t0]) < 1e-4  # the first from the parent
        got = result.scored[child.key]
        assert sorted(got) == list(range(len(PROMPT) + 1, len(ids)))
        for p, v in got.items():
            assert v.token_id == ids[p]
            assert abs(v.logprob - ref[p - 1][v.token_id]) < 1e-4
            assert [t for t, _ in v.top] == list(np.argsort(-ref[p - 1])[:2])
    runner.execute(sched.schedule())
    kv.check_invariants([])
