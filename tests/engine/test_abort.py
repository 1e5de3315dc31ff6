"""``LLMEngine.abort_request`` on a tiny random llama: running, waiting and forked (n > 1)
requests, samples not forked yet and a choice row's scoring requests are dropped between
steps. Oracles: the block pool's own reference counts (``check_invariants`` against the
requests still held; the active blocks are exactly their blocks, then none), the next
``SchedulerOutput.finished`` naming every dropped request (the runner frees its state from
it), and a run of the same engine configuration without the aborted requests (the others'
outputs, greedy and unseeded sampled, are the same)."""

from __future__ import annotations

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import RequestStatus
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.tiny_models import byte_tokenizer, tiny_llama

TOK = byte_tokenizer(eos_id=-1)  # no EOS: every request runs max_tokens
# 6 sequences at once: the choice row's label requests, then the forked samples, fill them
CONFIG = EngineConfig(block_size=4, num_blocks=160, max_num_seqs=6, max_num_batched_tokens=32)
DROPPED = {"pick": SamplingParams(max_tokens=4, structured_outputs=StructuredOutput.make(
               "choice", ["yes please", "no thanks", "maybe"])),
           "fork": SamplingParams(max_tokens=12, n=3, temperature=1.0),
           "run": SamplingParams(max_tokens=12)}
KEPT = {"keep": SamplingParams(max_tokens=10),
        "hot": SamplingParams(max_tokens=10, temperature=1.0)}  # unseeded: by its id
LAST = {"wait": SamplingParams(max_tokens=12)}  # dropped too; queued behind the others
PROMPT = "a shared start, then {}"
# What the dropped requests are doing after so many steps: (id, a forked sample (index > 0),
# a scoring request, running) of some held request, and whether samples wait to be forked.
STATES = {0: ({("fork", False, False, False), ("wait", False, False, False)}, True),
          1: ({("pick", False, True, True), ("run", False, False, False)}, True),
          2: ({("fork", True, False, True), ("fork", True, False, False),
               ("wait", False, False, False)}, False),
          4: ({("run", False, False, True), ("wait", False, False, True)}, False)}
@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _add(eng: LLMEngine, requests: dict[str, SamplingParams]) -> None:
    for rid, params in requests.items():
        assert eng.add_request(rid, TOK.encode(PROMPT.format(rid)), params) is None


def _held(eng: LLMEngine) -> list:
    return [*eng.scheduler.running, *eng.scheduler.waiting]


def _finish(eng: LLMEngine, finished: list) -> dict:
    """Run to the end; the outputs by (id, sample); every step's ``finished`` into
    ``finished``."""
    outs, schedule = {}, eng.scheduler.schedule

    def spy():
        out = schedule()
        finished.extend(out.finished)
        return out

    eng.scheduler.schedule = spy
    while eng.has_unfinished_requests() or eng.scheduler.has_finished_requests():
        outs.update({(o.request_id, o.sample_index): o.token_ids for o in eng.step()})
    return outs


def _baseline(model) -> dict:
    eng = LLMEngine(CONFIG, model, TOK)
    _add(eng, KEPT)
    return _finish(eng, [])


@pytest.mark.parametrize("steps", STATES, ids=["queued", "scoring", "forked", "decoding"])
def test_aborted_requests_free_their_blocks_and_leave_the_rest_alone(model, steps):
    eng = LLMEngine(CONFIG, model, TOK)
    assert eng.kv_cache_manager.num_active_blocks == 0  # the baseline
    _add(eng, {**DROPPED, **KEPT, **LAST})
    outs = {}
    for _ in range(steps):
        outs.update({(o.request_id, o.sample_index): o.token_ids for o in eng.step()})
    dropped = [r for r in _held(eng) if r.request_id not in KEPT]
    doing = {(r.request_id, r.sample_index > 0, r.score_only,
              r.status == RequestStatus.RUNNING) for r in dropped}
    want, unforked = STATES[steps]
    assert want <= doing and bool(eng.forks) == unforked, doing
    assert len(eng.choice_scores) == (steps < 2)  # "pick" is done after two steps
    eng.abort_request([*DROPPED, *LAST, "no-such-id"])
    assert not eng.forks and len(eng.choice_scores) == 0  # nothing of theirs kept
    kept = _held(eng)
    assert {r.request_id for r in kept} == set(KEPT)
    kv = eng.kv_cache_manager
    kv.check_invariants(kept)  # every block's holders: the kept requests and the tree
    assert kv.num_active_blocks == len({b for r in kept for t in r.block_tables for b in t if b})
    finished = []
    outs.update(_finish(eng, finished))
    assert {id(r) for r in dropped} <= {id(r) for r in finished}  # the runner was told
    assert {k: v for k, v in outs.items() if k[0] in KEPT} == _baseline(model)
    assert {k[0] for k in outs} <= {*KEPT, "pick"}  # "pick" only when done before the abort
    kv.check_invariants([])
    assert kv.num_active_blocks == 0


def test_samples_not_forked_yet_never_start(model):
    eng = LLMEngine(CONFIG, model, TOK)
    _add(eng, {"fork": DROPPED["fork"]})
    assert eng.forks  # sample 0's prefill has not run: 1 and 2 wait for it
    eng.abort_request("fork")
    assert not eng.has_unfinished_requests() and not eng.forks
    assert _finish(eng, []) == {}
    eng.kv_cache_manager.check_invariants([])


def test_unknown_and_finished_ids_are_ignored_and_an_id_is_free_again(model):
    eng = LLMEngine(CONFIG, model, TOK)
    _add(eng, {"keep": KEPT["keep"]})
    want = _finish(eng, [])
    eng.abort_request("keep")  # finished: nothing to do
    eng.abort_request([])
    eng.abort_request(iter(["nothing", "here"]))
    _add(eng, {"keep": KEPT["keep"]})  # the id of a finished request can be given again
    with pytest.raises(ValueError, match="request id 'keep' is already running"):
        eng.add_request("keep", [5, 6], SamplingParams())
    with pytest.raises(TypeError, match="request_id must be a string, got int"):
        eng.add_request(7, [5, 6], SamplingParams())
    assert _finish(eng, []) == want
    eng.abort_unfinished()  # nothing in flight: nothing to do
    _add(eng, {"hot": KEPT["hot"], **DROPPED})
    eng.step()
    eng.step()
    eng.abort_unfinished()  # everything: the engine is clean, the runner told at once
    assert not eng.has_unfinished_requests() and not eng.scheduler.has_finished_requests()
    assert eng.kv_cache_manager.num_active_blocks == 0
