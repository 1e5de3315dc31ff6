"""Admission with room to finish (Scheduler._room_to_finish) for long prompts in a pool a
little short, on a sliding-window layout: counted by hand, against vLLM's admission (start
whatever chunk fits, preempt later) as the oracle of the work a preemption wastes."""

from __future__ import annotations

from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import BlockPool
from mlxpa.core.kv_cache_groups import group_entries
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.scheduler import Scheduler
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams

BS = 16
PROMPT, OUT, ROWS = 1024, 64, 4
# One full-attention layer and one with a 64-token window: a request ends holding
# ceil(1087 / 16) = 68 full blocks and ceil(64 / 16) + 1 = 5 window blocks.
END_BLOCKS = 68 + 5
LAYOUT = group_entries([(None, "pool"), (64, "pool")], BS)


def _run(usable_blocks: int) -> tuple[int, int, int]:
    """4 prompts of 1,024 distinct tokens, 64 output tokens each, 512-token steps; returns
    (most requests running at once, preemptions, tokens computed)."""
    kv = KVCacheManager(BlockPool(usable_blocks + 1, BS), layout=LAYOUT)
    sched = Scheduler(EngineConfig(max_num_batched_tokens=512), kv, max_model_len=4096)
    for i in range(ROWS):
        tokens = list(range(10_000 * (i + 1), 10_000 * (i + 1) + PROMPT))
        sched.add_request(Request(str(i), tokens, SamplingParams(max_tokens=OUT,
                                                                 ignore_eos=True)))
    most = computed = 0
    for _ in range(2_000):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        kv.check_invariants(sched.running + list(sched.waiting))
        most = max(most, len(sched.running))
        computed += out.total_num_scheduled_tokens
        sched.update_from_output(out, [[7] for s in out.sampling if s])
    else:
        raise AssertionError("did not finish")
    kv.check_invariants([])
    assert kv.pool.num_free_blocks + kv.tree.evictable_blocks == usable_blocks
    return most, sched.num_preemptions, computed


def test_all_start_when_they_fit_at_their_ends():
    """Room for the four at their ends (4 x 73 blocks) though not for the fourth's prefill
    windows (21 blocks at the 256-token cap) beside the others' ends: all four run at once."""
    assert _run(ROWS * END_BLOCKS) == (ROWS, 0, ROWS * (PROMPT + OUT - 1))


def test_a_long_prompt_waits_instead_of_being_preempted(monkeypatch):
    """Six blocks short: the fourth prompt starts when the first request ends and no token
    is computed twice. Started as soon as its first chunk fits (vLLM), it is preempted near
    the end and its prompt computed again."""
    short = ROWS * END_BLOCKS - 6
    assert _run(short) == (ROWS - 1, 0, ROWS * (PROMPT + OUT - 1))
    monkeypatch.setattr(Scheduler, "_waits_for_room",
                        lambda self, req, cached: bool(req.num_preemptions))
    most, preemptions, computed = _run(short)
    assert most == ROWS and preemptions >= 1
    assert computed >= ROWS * (PROMPT + OUT - 1) + PROMPT


def test_a_prompt_of_one_chunk_starts_as_in_vllm():
    """A prompt that one step computes starts whenever its chunk fits (its recompute costs at
    most one step): the same 4 requests with 256-token prompts in a pool short of their ends
    all start at once."""
    kv = KVCacheManager(BlockPool(2 * 25 + 1, BS), layout=LAYOUT)
    sched = Scheduler(EngineConfig(max_num_batched_tokens=512), kv,
                      max_model_len=4096)
    for i in range(ROWS):
        tokens = list(range(10_000 * (i + 1), 10_000 * (i + 1) + 64))
        sched.add_request(Request(str(i), tokens, SamplingParams(max_tokens=256,
                                                                 ignore_eos=True)))
    sched.schedule()
    assert len(sched.running) == ROWS  # 4 x 25 blocks at their ends, 50 in the pool


def _first_steps(ignore_eos: bool, score_only: bool = False,
                 long_ignores_eos: bool | None = None) -> list[list[str]]:
    """A 500-token prompt running with max_tokens 5,900, then a 4,000-token prompt arriving
    (max_tokens 2,400), in 400 blocks of 16 (6,400 tokens): which requests run in the next
    three steps."""
    kv = KVCacheManager(BlockPool(401, BS))
    sched = Scheduler(EngineConfig(max_num_batched_tokens=512), kv, max_model_len=6400)
    sched.add_request(Request("R", list(range(500)),
                              SamplingParams(max_tokens=5900, ignore_eos=ignore_eos)))
    for _ in range(2):   # R's prompt: 512 + 1 tokens a step at most
        out = sched.schedule()
        sched.update_from_output(out, [[7] for s in out.sampling if s])
    sched.add_request(Request("L", list(range(1000, 5000)),
                              SamplingParams(max_tokens=2400, ignore_eos=ignore_eos
                                             if long_ignores_eos is None else long_ignores_eos),
                              score_only=score_only))
    steps = []
    for _ in range(3):
        out = sched.schedule()
        steps.append([r.request_id for r in out.requests])
        sched.update_from_output(out, [[7] for s in out.sampling if s])
    return steps


def test_outputs_an_eos_may_cut_short_are_not_reserved():
    """Requests that stop at EOS are counted to their min_tokens (0): the long prompt fits
    beside the running one (32 + 250 of 400 blocks) and starts at once, as the rule before
    this reserve had it. Both sure to reach max_tokens (ignore_eos: 400 + 400 blocks), the
    long prompt waits: started, it would be preempted."""
    assert _first_steps(ignore_eos=False) == [["R", "L"]] * 3
    assert _first_steps(ignore_eos=True) == [["R"]] * 3


def test_a_scoring_prefill_is_counted_without_outputs():
    """A score_only request samples nothing: its max_tokens does not hold it back. Sure to
    reach its 2,400 outputs (ignore_eos), the same prompt would need all 400 blocks."""
    assert _first_steps(False, score_only=True, long_ignores_eos=True)[0] == ["R", "L"]
    assert _first_steps(False, long_ignores_eos=True)[0] == ["R"]
