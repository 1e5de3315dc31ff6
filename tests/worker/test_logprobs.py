"""The worker's generic scoring (vLLM's ``prompt_logprobs`` mechanism) against a float64
oracle: the log-softmax, in float64, of mlx-lm's own full forward pass over the prompt.

Requests with ``num_scored_tokens`` run through the real scheduler, KV cache manager and model
runner; every scored position (the prompt token at ``p`` given the tokens before it) and its
``scored_top_logprobs`` alternatives must match the oracle, in one prefill, across a chunked
prefill, after a prefix-cache hit (which must stop before the scored tokens), and for every
prompt position at once."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request, TokenLogprob
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.model_runner import ModelRunner
from tests.tiny_models import float64_log_softmax as oracle
from tests.tiny_models import tiny_gemma3, tiny_llama

BS = 8
PROMPT = [(7 * i * i + 3 * i + 5) % 250 + 3 for i in range(30)]  # 30 tokens: 3 full blocks
TOP = 3


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return tiny_llama() if request.param == "llama" else tiny_gemma3(sliding_window=8)



def run(model, config: EngineConfig, *batches: list[Request]) -> dict[Request, dict]:
    """Run each batch of requests to completion in turn, through one scheduler and runner
    (a later batch can hit the prefix cache the earlier ones filled); every scored position
    of every step, each reported once."""
    runner = ModelRunner(model, config)
    runner.allocate_kv_cache(runner.budget_blocks)
    kv = KVCacheManager(BlockPool(runner.num_blocks, config.block_size), True,
                        runner.kv_cache_layout)
    sched = Scheduler(config, kv, runner.max_model_len)
    scored: dict[Request, dict[int, TokenLogprob]] = {}
    for batch in batches:
        for req in batch:
            sched.add_request(req)
            scored[req] = {}
        while sched.has_unfinished_requests() or sched.has_finished_requests():
            out = sched.schedule()
            result = runner.execute(out)
            ran = {r.key: r for r in out.requests}
            for key, by_position in result.scored.items():  # keyed by the request's key
                req = ran[key]
                assert not set(by_position) & set(scored[req])  # each position once
                scored[req].update(by_position)
            sched.update_from_output(out, result.sampled)
    return scored


def scoring(num_scored: int, top: int = TOP) -> Request:
    return Request("s", list(PROMPT), SamplingParams(max_tokens=1),
                   num_scored_tokens=num_scored, scored_top_logprobs=top)


def check(model, got: dict[int, TokenLogprob], positions: range, top: int = TOP) -> None:
    ref = oracle(model, PROMPT)
    assert sorted(got) == list(positions)
    for p in positions:
        row = ref[p - 1]  # the logits before position p score the token at p
        lp = got[p]
        assert lp.token_id == PROMPT[p]
        assert abs(lp.logprob - row[PROMPT[p]]) < 1e-4, p
        assert [t for t, _ in lp.top] == list(np.argsort(-row)[:top]), p
        for t, v in lp.top:
            assert abs(v - row[t]) < 1e-4, (p, t)


@pytest.mark.parametrize("budget", [2048, 7], ids=["one-prefill", "chunked"])
def test_scored_positions_match_mlx_lm(model, budget):
    """The last 12 prompt tokens (positions 18..29, scored by the logits at 17..28), in one
    prefill or in chunks of 7 tokens (those logits fall in three chunks: 14..20, 21..27,
    28..29)."""
    req = scoring(12)
    got = run(model, EngineConfig(block_size=BS, num_blocks=32, max_num_batched_tokens=budget),
              [req])
    check(model, got[req], range(18, 30))


def test_prefix_hit_stops_before_the_scored_tokens(model):
    """A first request caches the prompt's 3 full blocks. The scoring request hits only what
    precedes its scored tokens and the position before them (30 - 1 - 12 = 17 tokens: 2 whole
    blocks, 16 tokens), computes the rest on top of the cached K/V and scores all 12."""
    first = Request("f", list(PROMPT), SamplingParams(max_tokens=1))
    req = scoring(12)
    got = run(model, EngineConfig(block_size=BS, num_blocks=32), [first], [req])
    assert req.num_cached_tokens == 16
    check(model, got[req], range(18, 30))
    assert got[first] == {}


def test_every_prompt_position_with_its_alternatives(model):
    """``prompt_logprobs``' request: every prompt token but the first (which nothing
    precedes) with 5 alternatives each; the cache holds the whole prompt, yet nothing of it
    may be a hit (every position's logits are needed)."""
    first = Request("f", list(PROMPT), SamplingParams(max_tokens=1))
    req = scoring(len(PROMPT) - 1, top=5)
    got = run(model, EngineConfig(block_size=BS, num_blocks=32, max_num_batched_tokens=11),
              [first], [req])
    assert req.num_cached_tokens == 0
    check(model, got[req], range(1, len(PROMPT)), top=5)
