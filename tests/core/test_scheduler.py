"""Tests for mlxpa.core.scheduler: continuous batching, chunked prefill, budgets, LIFO preemption by
recompute, finishing, clamping; driven by hand with fake sampled token ids.

Setup: a pool of ``num_blocks=11`` blocks of 4 tokens (40 usable token slots),
exact scheduled requests and token counts per step, ``check_invariants()`` after every step.
The scheduler reads the block size from the :class:`KVCacheManager`, so the config keeps its
default block size.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.scheduler import Scheduler, SchedulerOutput
from mlxpa.request import Request, RequestStatus
from mlxpa.sampling_params import SamplingParams
from mlxpa.utils import cdiv

BS = 4
NB = 11
USABLE = NB - 1
EOS = 99
TOK = 7  # the default fake sampled token (never an EOS id)


def make_scheduler(max_num_seqs: int = 8, max_num_batched_tokens: int = 64,
                   max_model_len: int = 1000, num_blocks: int = NB,
                   eos: frozenset[int] = frozenset({EOS})) -> Scheduler:
    config = EngineConfig(num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens)
    return Scheduler(config, KVCacheManager(BlockPool(num_blocks, BS), enable_prefix_caching=False),
                     max_model_len=max_model_len, eos_token_ids=eos)


def make_request(request_id: object, num_prompt_tokens: int, max_tokens: int = 16,
                 ignore_eos: bool = False) -> Request:
    tokens = list(range(100, 100 + num_prompt_tokens))
    return Request(request_id, tokens, SamplingParams(max_tokens=max_tokens,
                                                      ignore_eos=ignore_eos))


def add(sched: Scheduler, *reqs: Request) -> None:
    for r in reqs:
        sched.add_request(r)
    check(sched)


def check(sched: Scheduler) -> None:
    """Pool and request bookkeeping agree (run between steps)."""
    live = sched.running + list(sched.waiting)
    sched.kv_cache_manager.check_invariants(live)
    assert len(sched.running) <= sched.max_num_seqs
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert 0 < r.num_computed_tokens < r.num_tokens
        assert len(r.block_tables[0]) == cdiv(r.num_computed_tokens, BS)
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.num_computed_tokens == 0 and r.block_tables == []
    held = sum(len(t) for r in live for t in r.block_tables)
    assert sched.kv_cache_manager.num_used_blocks == held


def step(sched: Scheduler, tokens: dict[object, int] | None = None,
         ) -> tuple[SchedulerOutput, list[tuple[object, int, bool]]]:
    """One step: schedule, feed one fake token per sampling request, update.

    Returns the output and ``(request_id, num_scheduled_tokens, sampling)`` per request.
    """
    tokens = tokens or {}
    out = sched.schedule()
    # Right after scheduling, each scheduled request holds blocks for its chunk.
    sched.kv_cache_manager.check_invariants(sched.running + list(sched.waiting))
    for r, n in zip(out.requests, out.num_scheduled_tokens, strict=True):
        assert r.status == RequestStatus.RUNNING
        assert 1 <= n <= r.num_tokens - r.num_computed_tokens
        assert len(r.block_tables[0]) == cdiv(r.num_computed_tokens + n, BS)
    assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
    assert len(out.requests) <= sched.max_num_seqs
    sampling = out.sampling
    summary = [(r.request_id, n, s) for r, n, s in
               zip(out.requests, out.num_scheduled_tokens, sampling, strict=True)]
    sampled = [tokens.get(r.request_id, TOK)
               for r, s in zip(out.requests, sampling, strict=True) if s]
    updated = sched.update_from_output(out, [[t] for t in sampled])
    assert updated == [r for r, s in zip(out.requests, sampling, strict=True) if s]
    check(sched)
    return out, summary


def run_to_completion(sched: Scheduler, max_steps: int = 200) -> list[list]:
    """Step until nothing is left; return every step's summary; assert no block leaked."""
    steps = []
    while sched.has_unfinished_requests():
        assert len(steps) < max_steps, "scheduler did not terminate"
        steps.append(step(sched)[1])
    assert sched.kv_cache_manager.num_used_blocks == 0
    assert sched.kv_cache_manager.pool.num_free_blocks == USABLE
    sched.kv_cache_manager.pool.check_invariants([])
    return steps


def next_ids(sched: Scheduler, n: int) -> list[int]:
    """The next ``n`` block ids the pool would hand out (free-queue order)."""
    return sched.kv_cache_manager.pool.free_queue()[:n]


# ----------------------------------------------------------------------------- basics


def test_single_request_prefill_then_decode():
    sched = make_scheduler()
    a = make_request("a", 6, max_tokens=3)
    add(sched, a)
    assert a.status == RequestStatus.WAITING and a.max_tokens == 3
    out, s = step(sched)
    assert s == [("a", 6, True)]
    assert out.blocks_to_copy == [] and out.preempted == []
    assert a.block_tables[0] == [1, 2] and a.num_computed_tokens == 6
    assert a.output_token_ids == [TOK] and a.num_cached_tokens == 0
    assert step(sched)[1] == [("a", 1, True)]
    assert a.num_computed_tokens == 7 and a.num_output_tokens == 2
    assert step(sched)[1] == [("a", 1, True)]
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert a.finish_reason == "length" and a.stop_reason is None
    assert a.output_token_ids == [TOK] * 3
    assert a.block_tables == [] and sched.running == []
    assert not sched.has_unfinished_requests()
    assert len(a.token_times) == 3
    # Freed tail first: block 2 comes back before block 1.
    assert next_ids(sched, USABLE) == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]


def test_schedule_with_nothing_to_do():
    sched = make_scheduler()
    out = sched.schedule()
    assert out.requests == [] and out.num_scheduled_tokens == [] and out.sampling == []
    assert sched.update_from_output(out, []) == []


def test_continuous_batching_admits_while_others_decode():
    sched = make_scheduler(max_num_seqs=4)
    a = make_request("a", 4, max_tokens=4)
    add(sched, a)
    assert step(sched)[1] == [("a", 4, True)]
    assert a.block_tables[0] == [1]
    b = make_request("b", 3, max_tokens=2)
    add(sched, b)
    # The decode of a and the whole prefill of b run in one step.
    assert step(sched)[1] == [("a", 1, True), ("b", 3, True)]
    assert a.block_tables[0] == [1, 2] and b.block_tables[0] == [3]
    c = make_request("c", 9, max_tokens=1)
    add(sched, c)
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True), ("c", 9, True)]
    assert b.is_finished and c.is_finished
    assert c.block_tables == [] and b.block_tables == []
    assert sched.running == [a]
    assert step(sched)[1] == [("a", 1, True)]
    assert a.is_finished and a.num_output_tokens == 4
    assert run_to_completion(sched) == []


def test_chunked_prefill_samples_only_on_last_chunk():
    sched = make_scheduler(max_num_batched_tokens=4)
    a = make_request("a", 10, max_tokens=2)
    add(sched, a)
    out, s = step(sched)
    assert s == [("a", 4, False)]
    assert a.num_computed_tokens == 4 and a.output_token_ids == [] and a.block_tables[0] == [1]
    out, s = step(sched)
    assert s == [("a", 4, False)]
    assert a.num_computed_tokens == 8 and a.block_tables[0] == [1, 2]
    out, s = step(sched)
    assert s == [("a", 2, True)]
    assert out.total_num_scheduled_tokens == 2
    assert a.num_computed_tokens == 10 and a.output_token_ids == [TOK]
    assert a.block_tables[0] == [1, 2, 3]
    assert step(sched)[1] == [("a", 1, True)]
    assert a.is_finished and a.output_token_ids == [TOK, TOK]
    assert run_to_completion(sched) == []


def test_chunked_prefill_of_two_requests_one_at_a_time():
    sched = make_scheduler(max_num_batched_tokens=4)
    a, b = make_request("a", 6, max_tokens=2), make_request("b", 5, max_tokens=1)
    add(sched, a, b)
    steps = run_to_completion(sched)
    assert steps == [
        [("a", 4, False)],
        [("a", 2, True), ("b", 2, False)],
        [("a", 1, True), ("b", 3, True)],
    ]
    assert a.output_token_ids == [TOK, TOK] and b.output_token_ids == [TOK]


def test_token_budget_shared_between_decodes_and_prefill_chunk():
    sched = make_scheduler(max_num_batched_tokens=4)
    # c's prompt takes two chunks: it starts once all three can finish in the pool (9 blocks)
    a, b, c = (make_request("a", 3, max_tokens=5), make_request("b", 3, max_tokens=5),
               make_request("c", 5, max_tokens=6))
    add(sched, a, b, c)
    assert step(sched)[1] == [("a", 3, True), ("b", 1, False)]
    assert c.status == RequestStatus.WAITING
    assert step(sched)[1] == [("a", 1, True), ("b", 2, True), ("c", 1, False)]
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True), ("c", 2, False)]
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True), ("c", 2, True)]
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True), ("c", 1, True)]
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (5, 4, 2)


def test_budget_smaller_than_running_decodes():
    sched = make_scheduler(max_num_batched_tokens=2)
    reqs = [make_request(r, 1, max_tokens=3) for r in "abc"]
    add(sched, *reqs)
    steps = run_to_completion(sched)
    assert steps == [
        [("a", 1, True), ("b", 1, True)],
        [("a", 1, True), ("b", 1, True)],  # c waits: the decodes used the budget
        [("a", 1, True), ("b", 1, True)],
        [("c", 1, True)],
        [("c", 1, True)],
        [("c", 1, True)],
    ]


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = (make_request("a", 2, max_tokens=1), make_request("b", 2, max_tokens=3),
               make_request("c", 2, max_tokens=2))
    add(sched, a, b, c)
    assert step(sched)[1] == [("a", 2, True), ("b", 2, True)]
    assert list(sched.waiting) == [c] and c.block_tables == []
    assert a.is_finished  # one token asked for: done after its prefill
    # a's slot is free: c is admitted next to b's decode.
    assert step(sched)[1] == [("b", 1, True), ("c", 2, True)]
    assert step(sched)[1] == [("b", 1, True), ("c", 1, True)]
    assert b.is_finished and c.is_finished
    assert run_to_completion(sched) == []


def test_max_num_seqs_one_runs_requests_in_order():
    sched = make_scheduler(max_num_seqs=1)
    add(sched, make_request("a", 3, max_tokens=2), make_request("b", 5, max_tokens=1))
    assert run_to_completion(sched) == [
        [("a", 3, True)], [("a", 1, True)], [("b", 5, True)]]


def test_head_of_line_request_waits_for_blocks():
    sched = make_scheduler()
    a = make_request("a", 30, max_tokens=2)
    b = make_request("b", 12, max_tokens=1)  # needs 3 blocks, only 2 are left
    c = make_request("c", 1, max_tokens=1)
    add(sched, a, b, c)
    assert step(sched)[1] == [("a", 30, True)]
    assert a.block_tables[0] == list(range(1, 9))
    assert list(sched.waiting) == [b, c]  # c is not admitted past b
    assert step(sched)[1] == [("a", 1, True)]
    assert a.is_finished
    out, s = step(sched)
    assert s == [("b", 12, True), ("c", 1, True)]
    # a freed tail first: b gets the never-used 9, 10 and then a's last block.
    assert out.requests[0].output_token_ids == [TOK]
    assert run_to_completion(sched) == []


# ----------------------------------------------------------------------------- preemption


def test_preemption_is_lifo_and_recomputes_prompt_and_output():
    sched = make_scheduler()
    a = make_request("a", 16, max_tokens=4)
    b = make_request("b", 16, max_tokens=6)
    c = make_request("c", 8, max_tokens=3)
    add(sched, a, b, c)
    assert step(sched)[1] == [("a", 16, True), ("b", 16, True), ("c", 8, True)]
    assert (a.block_tables[0], b.block_tables[0], c.block_tables[0]) == (
        [1, 2, 3, 4], [5, 6, 7, 8], [9, 10])
    assert sched.kv_cache_manager.pool.num_free_blocks == 0
    c.output_token_ids[-1] = 42  # remember c's generated token
    # a needs a fifth block: c, the most recently admitted, is preempted; a gets c's tail
    # block 10, then b gets 9.
    out, s = step(sched)
    assert s == [("a", 1, True), ("b", 1, True)]
    assert out.preempted == [c]
    assert c.status == RequestStatus.PREEMPTED and c.num_preemptions == 1
    assert c.num_computed_tokens == 0 and c.block_tables == []
    assert c.output_token_ids == [42]
    assert list(sched.waiting) == [c] and sched.running == [a, b]
    assert sched.num_preemptions == 1
    assert a.block_tables[0] == [1, 2, 3, 4, 10] and b.block_tables[0] == [5, 6, 7, 8, 9]
    # No free block for c's 9 tokens until a finishes.
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True)]
    assert step(sched)[1] == [("a", 1, True), ("b", 1, True)]
    assert a.is_finished and c.status == RequestStatus.PREEMPTED
    # a freed [10, 4, 3, 2, 1]: c recomputes its prompt and its generated token (9 tokens).
    out, s = step(sched)
    assert s == [("b", 1, True), ("c", 9, True)]
    assert out.preempted == []
    assert c.block_tables[0] == [10, 4, 3]
    assert c.output_token_ids == [42, TOK]
    assert c.num_cached_tokens == 0  # set at first admission only
    steps = run_to_completion(sched)
    assert steps == [[("b", 1, True), ("c", 1, True)]]
    assert [r.num_output_tokens for r in (a, b, c)] == [4, 6, 3]
    assert [r.num_preemptions for r in (a, b, c)] == [0, 0, 1]


def test_last_running_request_preempts_itself():
    sched = make_scheduler()
    a = make_request("a", 31, max_tokens=2)  # 8 blocks, room for its first output
    b = make_request("b", 8, max_tokens=2)   # 2 blocks, full
    add(sched, a, b)
    assert step(sched)[1] == [("a", 31, True), ("b", 8, True)]
    assert sched.kv_cache_manager.pool.num_free_blocks == 0
    out, s = step(sched)
    # b's decode needs a third block; b is the last admitted, so b preempts itself.
    assert s == [("a", 1, True)]
    assert out.preempted == [b]
    assert a.is_finished
    assert b.status == RequestStatus.PREEMPTED and b.output_token_ids == [TOK]
    assert next_ids(sched, USABLE) == [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    out, s = step(sched)
    assert s == [("b", 9, True)]
    assert b.is_finished and b.output_token_ids == [TOK, TOK]
    assert run_to_completion(sched) == []


def test_preempted_requests_keep_admission_order_at_head_of_waiting():
    sched = make_scheduler(max_num_batched_tokens=64)
    a = make_request("a", 28, max_tokens=10)  # 7 blocks
    b = make_request("b", 4, max_tokens=10)   # 1 block
    c = make_request("c", 4, max_tokens=10)   # 1 block
    d = make_request("d", 4, max_tokens=10)   # 1 block
    e = make_request("e", 2, max_tokens=1)    # still waiting
    add(sched, a, b, c, d, e)
    assert step(sched)[1] == [("a", 28, True), ("b", 4, True), ("c", 4, True),
                              ("d", 4, True)]
    assert list(sched.waiting) == [e]
    # a, b, c, d each need a new block and none is free: a's need preempts d, b's preempts
    # c; both go back to the head of waiting in admission order, ahead of e.
    out, s = step(sched)
    assert s == [("a", 1, True), ("b", 1, True)]
    assert out.preempted == [d, c]
    assert list(sched.waiting) == [c, d, e]
    assert a.block_tables[0][-1] == 10 and b.block_tables[0][-1] == 9
    assert sched.num_preemptions == 2


def test_preemption_skips_admission_in_that_step():
    sched = make_scheduler()
    a = make_request("a", 20, max_tokens=2)  # 5 blocks
    b = make_request("b", 20, max_tokens=3)  # 5 blocks
    add(sched, a, b)
    assert step(sched)[1] == [("a", 20, True), ("b", 20, True)]
    c = make_request("c", 1, max_tokens=1)
    add(sched, c)
    out, s = step(sched)
    # a needs a sixth block: b is preempted (5 blocks freed); c would fit, but nothing is
    # admitted in a step that preempted.
    assert out.preempted == [b] and s == [("a", 1, True)]
    assert a.is_finished
    assert list(sched.waiting) == [b, c]
    out, s = step(sched)
    assert s == [("b", 21, True), ("c", 1, True)]
    assert b.block_tables[0] == [9, 8, 7, 6, 10, 5]


def test_preempted_mid_prefill_waits_until_it_can_finish(monkeypatch):
    # b's prompt takes several chunks, so it would wait for room to finish and never be
    # preempted; started as vLLM starts any request (whatever chunk fits), it is.
    monkeypatch.setattr(Scheduler, "_waits_for_room",
                        lambda self, req, cached: bool(req.num_preemptions))
    sched = make_scheduler(max_num_batched_tokens=8)
    a = make_request("a", 8, max_tokens=20)
    b = make_request("b", 32, max_tokens=2)
    add(sched, a, b)
    assert step(sched)[1] == [("a", 8, True)]
    for _ in range(4):
        assert step(sched)[1] == [("a", 1, True), ("b", 7, False)]
    assert a.block_tables[0] == [1, 2, 3] and b.block_tables[0] == [4, 5, 6, 7, 8, 9, 10]
    # a's 13th token needs a fourth block: b (mid-prefill) is preempted. A 7-token chunk of b
    # would fit in the freed blocks, but a step that preempted admits nothing.
    out, s = step(sched)
    assert s == [("a", 1, True)] and out.preempted == [b]
    assert a.block_tables[0] == [1, 2, 3, 10]
    assert b.num_computed_tokens == 0 and b.output_token_ids == []
    # b needs 9 blocks to finish beside the 3 more a needs, 6 being free: re-admitted now, it
    # would prefill again and be preempted again as a grows. It waits for a, then runs in
    # chunks, preempted no more.
    while not a.is_finished:
        assert step(sched)[1] == [("a", 1, True)]
    assert a.num_output_tokens == 20
    assert step(sched)[1] == [("b", 8, False)]
    run_to_completion(sched)
    assert b.num_output_tokens == 2 and sched.num_preemptions == 1


# ----------------------------------------------------------------------------- finishing


def test_eos_finishes_request():
    sched = make_scheduler()
    a, b = make_request("a", 5, max_tokens=10), make_request("b", 5, max_tokens=10)
    add(sched, a, b)
    step(sched)
    out, s = step(sched, {"a": EOS})
    assert s == [("a", 1, True), ("b", 1, True)]
    assert a.status == RequestStatus.FINISHED_STOPPED and a.finish_reason == "stop"
    assert a.stop_reason == EOS
    assert a.output_token_ids == [TOK, EOS]
    assert a.block_tables == [] and sched.running == [b]
    assert b.status == RequestStatus.RUNNING


def test_eos_on_first_token_after_prefill():
    sched = make_scheduler(eos=frozenset({1, EOS}))
    a = make_request("a", 3, max_tokens=10)
    add(sched, a)
    step(sched, {"a": 1})
    assert a.is_finished and a.finish_reason == "stop" and a.output_token_ids == [1]
    assert run_to_completion(sched) == []


def test_ignore_eos_runs_to_max_tokens():
    sched = make_scheduler()
    a = make_request("a", 5, max_tokens=3, ignore_eos=True)
    add(sched, a)
    for _ in range(3):
        step(sched, {"a": EOS})
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert a.output_token_ids == [EOS] * 3 and a.stop_reason is None


def test_eos_on_last_allowed_token_is_a_stop():
    sched = make_scheduler()
    a = make_request("a", 5, max_tokens=2)
    add(sched, a)
    step(sched)
    step(sched, {"a": EOS})
    assert a.status == RequestStatus.FINISHED_STOPPED and a.stop_reason == EOS


def test_max_tokens_one_finishes_after_prefill():
    sched = make_scheduler()
    a = make_request("a", 9, max_tokens=1)
    add(sched, a)
    assert run_to_completion(sched) == [[("a", 9, True)]]
    assert a.finish_reason == "length" and a.output_token_ids == [TOK]


def test_finish_request_aborts_waiting_running_and_preempted():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = (make_request(r, 4, max_tokens=10) for r in "abc")
    add(sched, a, b, c)
    step(sched)
    assert sched.running == [a, b] and list(sched.waiting) == [c]
    sched.finish_request(c, RequestStatus.FINISHED_ABORTED)
    assert c.finish_reason == "abort" and list(sched.waiting) == []
    check(sched)
    sched.finish_request(a, RequestStatus.FINISHED_ABORTED)
    assert a.block_tables == [] and sched.running == [b]
    check(sched)
    sched.finish_request(a, RequestStatus.FINISHED_STOPPED)  # already finished: no-op
    assert a.status == RequestStatus.FINISHED_ABORTED
    # A preempted request sits in waiting; aborting it removes it from there.
    sched.running.remove(b)
    sched._preempt(b, SchedulerOutput())
    assert b.status == RequestStatus.PREEMPTED
    check(sched)
    sched.finish_request(b, RequestStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.num_used_blocks == 0
    sched.kv_cache_manager.pool.check_invariants([])


def test_step_fields_are_values_and_finished_requests_reach_the_next_step():
    """``sampling`` and ``total_num_scheduled_tokens`` are fixed by ``schedule()`` (they read
    the same after ``update_from_output`` advanced the requests), and every request finished
    since a step, by the scheduler or from outside, is in the next step's ``finished``, once."""
    sched = make_scheduler()
    a, b = make_request("a", 6, max_tokens=2), make_request("b", 5, max_tokens=1)
    c = make_request("c", 3)
    add(sched, a, b)
    out = sched.schedule()
    assert (out.requests, out.sampling, out.total_num_scheduled_tokens) == ([a, b], [True] * 2,
                                                                            6 + 5)
    assert out.finished == [] and not sched.has_finished_requests()
    sched.update_from_output(out, [[TOK], [TOK]])  # b reaches max_tokens
    assert out.sampling == [True, True] and out.total_num_scheduled_tokens == 11
    assert b.is_finished and sched.has_finished_requests()
    out = sched.schedule()
    assert (out.requests, out.num_scheduled_tokens, out.finished) == ([a], [1], [b])
    assert not sched.has_finished_requests()
    sched.update_from_output(out, [[TOK]])  # a reaches max_tokens
    add(sched, c)
    sched.finish_request(c, RequestStatus.FINISHED_ABORTED)  # from outside, while waiting
    sched.finish_request(c, RequestStatus.FINISHED_STOPPED)  # already finished: not again
    out = sched.schedule()
    assert (out.requests, out.total_num_scheduled_tokens, out.finished) == ([], 0, [a, c])
    assert sched.schedule().finished == []


# ----------------------------------------------------------------------------- add_request


def test_max_tokens_clamped_to_max_model_len():
    sched = make_scheduler(max_model_len=12)
    a = make_request("a", 10, max_tokens=100)
    add(sched, a)
    assert a.max_tokens == 2 and a.sampling_params.max_tokens == 100
    assert run_to_completion(sched) == [[("a", 10, True)], [("a", 1, True)]]
    assert a.num_output_tokens == 2 and a.finish_reason == "length"


def test_max_tokens_clamped_to_pool_capacity():
    sched = make_scheduler(max_model_len=1000)
    assert sched.max_model_len == 40
    a = make_request("a", 30, max_tokens=100)
    add(sched, a)
    assert a.max_tokens == 10
    steps = run_to_completion(sched)
    assert steps == [[("a", 30, True)]] + [[("a", 1, True)]] * 9
    assert a.num_output_tokens == 10 and sched.num_preemptions == 0


def test_max_tokens_not_raised_by_clamp():
    sched = make_scheduler(max_model_len=12)
    a = make_request("a", 3, max_tokens=4)
    add(sched, a)
    assert a.max_tokens == 4


@pytest.mark.parametrize("n", [39, 1])
def test_prompt_at_the_limit_is_accepted(n):
    sched = make_scheduler()
    a = make_request("a", n, max_tokens=5)
    add(sched, a)
    assert a.max_tokens == min(5, 40 - n)
    run_to_completion(sched)
    assert a.num_output_tokens == a.max_tokens


@pytest.mark.parametrize("n", [40, 41, 100])
def test_prompt_too_long_for_pool_raises(n):
    sched = make_scheduler(max_model_len=1000)
    with pytest.raises(ValueError, match="39"):
        sched.add_request(make_request("a", n))
    assert not sched.has_unfinished_requests()


def test_prompt_too_long_for_model_raises():
    sched = make_scheduler(max_model_len=8)
    with pytest.raises(ValueError, match=r"\b7\b"):
        sched.add_request(make_request("a", 8))
    assert not sched.has_unfinished_requests()


def test_empty_prompt_raises():
    sched = make_scheduler()
    with pytest.raises(ValueError, match="empty"):
        sched.add_request(make_request("a", 0))
    assert not sched.has_unfinished_requests()


def test_bad_request_does_not_block_the_queue():
    sched = make_scheduler()
    a = make_request("a", 3, max_tokens=1)
    add(sched, a)
    with pytest.raises(ValueError):
        sched.add_request(make_request("big", 50))
    add(sched, make_request("b", 2, max_tokens=1))
    assert run_to_completion(sched) == [[("a", 3, True), ("b", 2, True)]]


# ----------------------------------------------------------------------------- property test


@settings(max_examples=200, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(1, 24), st.integers(1, 12)), min_size=2,
                     max_size=10),
    arrivals=st.lists(st.integers(0, 6), max_size=10),
    budget=st.integers(1, 40),
    max_num_seqs=st.integers(1, 6),
    num_blocks=st.integers(3, 9),
)
def test_random_workloads_terminate_without_leaks(prompts, arrivals, budget, max_num_seqs,
                                                 num_blocks):
    sched = make_scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                           num_blocks=num_blocks)
    capacity = (num_blocks - 1) * BS
    reqs = []
    pending = []  # (arrival step, request)
    for i, (p, m) in enumerate(prompts):
        r = make_request(i, p, max_tokens=m)
        if p >= capacity:
            with pytest.raises(ValueError):
                sched.add_request(r)
            continue
        arrival = arrivals[i] if i < len(arrivals) else 0
        pending.append((arrival, r))
        reqs.append(r)
    # A bound that holds whatever the preemptions: the oldest running request is never
    # preempted and computes at least one token per step.
    bound = sum(r.num_prompt_tokens + min(r.sampling_params.max_tokens,
                                          capacity - r.num_prompt_tokens) for r in reqs)
    bound += max((a for a, _ in pending), default=0) + 1
    n_steps = 0
    while pending or sched.has_unfinished_requests():
        for a, r in [x for x in pending if x[0] <= n_steps]:
            sched.add_request(r)
            pending.remove((a, r))
        check(sched)
        # The sampled token encodes its position, so a token sampled at a wrong position
        # (double sampling after a recompute, a skipped token) shows in the outputs.
        out = sched.schedule()
        sched.kv_cache_manager.check_invariants(sched.running + list(sched.waiting))
        assert out.total_num_scheduled_tokens <= budget
        assert len(out.requests) <= max_num_seqs
        assert len(set(map(id, out.requests))) == len(out.requests)
        sampled = [1000 + r.num_tokens
                   for r, s in zip(out.requests, out.sampling, strict=True) if s]
        sched.update_from_output(out, [[t] for t in sampled])
        check(sched)
        n_steps += 1
        assert n_steps <= bound, "scheduler did not terminate in time"
    for r in reqs:
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert r.max_tokens == min(r.sampling_params.max_tokens, capacity - r.num_prompt_tokens)
        p = r.num_prompt_tokens
        assert r.output_token_ids == [1000 + p + k for k in range(r.max_tokens)]
        assert r.block_tables == []
    assert sched.kv_cache_manager.num_used_blocks == 0
    sched.kv_cache_manager.pool.check_invariants([])
    assert sorted(sched.kv_cache_manager.pool.free_queue()) == list(range(1, num_blocks))
    event(f"preempted: {sched.num_preemptions > 0}")


# ----------------------------------------------------------------------------- n > 1 samples


def test_n_samples_never_exceed_max_num_seqs():
    """n = 50 samples with max_num_seqs = 4: after sample 0's prefill, 3 children fork its
    blocks (the free slots) and 46 wait; the waiting ones read the prompt's full block from
    the prefix cache. Running never exceeds 4, every sample finishes with its 3 tokens and
    every block goes back to the pool."""
    config = EngineConfig(num_blocks=NB, max_num_seqs=4, max_num_batched_tokens=64)
    kv = KVCacheManager(BlockPool(NB, BS), enable_prefix_caching=True)
    sched = Scheduler(config, kv, max_model_len=1000, eos_token_ids=frozenset({EOS}))
    params = SamplingParams(max_tokens=3, n=50)
    parent = Request(0, list(range(100, 106)), params)  # 6 tokens: 1 full block + 2
    sched.add_request(parent)
    children = [Request(0, parent.prompt_token_ids, params, sample_index=i)
                for i in range(1, 50)]
    out = sched.schedule()
    assert out.requests == [parent] and out.sampling == [True]
    sched.add_samples(parent, children)
    assert sched.running == [parent, *children[:3]]
    assert list(sched.waiting) == children[3:]
    assert [c.num_computed_tokens for c in children[:3]] == [5, 5, 5]
    sched.update_from_output(out, [[TOK]])
    num_steps, most = 1, 4
    while sched.has_unfinished_requests():
        assert num_steps < 200
        out = sched.schedule()
        assert len(out.requests) <= 4
        sched.update_from_output(out, [[TOK]] * sum(out.sampling))
        kv.check_invariants(sched.running + list(sched.waiting))
        most = max(most, len(sched.running))
        num_steps += 1
    assert most == 4
    everyone = [parent, *children]
    assert all(r.output_token_ids == [TOK] * 3 for r in everyone)
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in everyone)
    assert [r.num_cached_tokens for r in everyone] == [0] * 4 + [4] * 46
    assert kv.num_active_blocks == 0
    kv.tree.evict(USABLE)
    assert kv.pool.num_free_blocks == USABLE
    kv.check_invariants([])


def test_fork_request_refuses_a_full_batch():
    sched = make_scheduler(max_num_seqs=1)
    parent = make_request("p", 6)
    add(sched, parent)
    step(sched)
    with pytest.raises(RuntimeError, match="max_num_seqs=1"):
        sched.fork_request(parent, make_request("c", 6))
    sched.add_samples(parent, [make_request("c", 6)])
    assert [r.request_id for r in sched.waiting] == ["c"]


def _run_all(sched: Scheduler) -> int:
    """Steps until every request finished; the tokens computed on the way."""
    computed = 0
    for _ in range(2000):
        if not (sched.waiting or sched.running):
            return computed
        out, s = step(sched)
        check(sched)
        computed += sum(n for _, n, _ in s)
    raise AssertionError("did not finish")


def _thrash_case(budget: int, max_tokens: int) -> Scheduler:
    sched = make_scheduler(num_blocks=40, max_num_batched_tokens=budget)
    add(sched, *[make_request(str(i), 32, max_tokens=max_tokens, ignore_eos=True)
                 for i in range(4)])
    return sched


def test_a_preempted_request_waits_for_room_to_finish(monkeypatch):
    """4 prompts of 32 tokens (two 16-token chunks each), 16 output tokens each, 39 usable
    blocks of 4 tokens: 48 blocks to finish all. Started only with room to finish, the fourth
    waits for the first to end: no preemption, and every request computes its 47 tokens once.
    Started as soon as its first chunk fits (vLLM's admission) and re-admitted likewise (the
    unguarded rule, the oracle here), it is preempted, prefills again and is preempted again;
    re-admitted only with room to finish, it is preempted once, and its recompute is the only
    work beyond the 4 x 47 tokens."""
    guarded = _thrash_case(16, 16)
    assert _run_all(guarded) == 4 * 47 and guarded.num_preemptions == 0
    monkeypatch.setattr(Scheduler, "_waits_for_room",
                        lambda self, req, cached: bool(req.num_preemptions))
    readmission = _thrash_case(16, 16)
    computed = _run_all(readmission)
    assert readmission.num_preemptions == 1 and computed > 4 * 47
    monkeypatch.setattr(Scheduler, "_room_to_finish", lambda self, req, need, hit=None: True)
    unguarded = _thrash_case(16, 16)
    assert _run_all(unguarded) > computed and unguarded.num_preemptions == 2


def test_the_guard_never_starves_and_never_adds_work(monkeypatch):
    """Outputs far too long for the pool (4 x 112 tokens in 156 token slots): every request
    still finishes, and the guarded scheduler computes no more than the unguarded one."""
    guarded = _thrash_case(16, 80)
    computed = _run_all(guarded)
    monkeypatch.setattr(Scheduler, "_room_to_finish", lambda self, req, need, hit=None: True)
    unguarded = _thrash_case(16, 80)
    assert _run_all(unguarded) >= computed
    assert guarded.num_preemptions <= unguarded.num_preemptions
