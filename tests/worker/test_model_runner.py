"""Units of the model runner, each against a hand-computed or sliced oracle: the grouping of
scheduled requests into padded batches, token slices across the prompt/output boundary, the
incremental block-table sync (copy-on-write of the partial block, a preemption), and the
scheduler boundary on hand-built steps (the runner frees exactly the requests it is told of,
reports grammar endings, returns the one empty result)."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.config import EngineConfig
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.request import Request, RequestStatus
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from mlxpa.worker.model_runner import ModelRunner, group_by_length, token_slice
from mlxpa.worker.outputs import EMPTY_STEP_RESULT
from tests.tiny_models import byte_tokenizer, tiny_llama


def test_group_by_length_decodes_together_prefills_by_similar_length():
    # Decodes (1 token) form one group; prefill chunks longest first, a chunk joining the
    # group while it pads by at most 32 tokens: 70 and 40 (pad 30) together, 9 alone.
    assert group_by_length([1, 40, 1, 9, 70]) == [[0, 2], [4, 1], [3]]
    assert group_by_length([5, 5, 5]) == [[0, 1, 2]]
    assert group_by_length([1, 1]) == [[0, 1]]
    assert group_by_length([100, 67, 68]) == [[0, 2], [1]]  # 100 - 68 = 32 fits, 33 does not
    assert group_by_length([]) == []


def test_token_slice_matches_slicing_the_whole_context():
    req = Request(0, [11, 12, 13, 14, 15], SamplingParams(max_tokens=8))
    req.output_token_ids = [21, 22, 23]
    whole = req.prompt_token_ids + req.output_token_ids
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert token_slice(req, start, end) == whole[start:end], (start, end)
    assert token_slice(req, 3, 7) == [14, 15, 21, 22]  # across the boundary


def allocated(runner: ModelRunner) -> ModelRunner:
    runner.allocate_kv_cache(runner.budget_blocks)
    return runner


@pytest.fixture(scope="module")
def runner():
    return allocated(ModelRunner(tiny_llama(), EngineConfig(num_blocks=32, block_size=8)))


def test_block_table_sync_rereads_the_tail_and_restarts_after_preemption(runner):
    req = Request("r", list(range(3, 23)), SamplingParams(max_tokens=8))  # 20 prompt tokens
    req.block_tables = [[5, 6, 7]]
    assert runner._tables.get(req)[0].tolist() == [5, 6, 7]
    # 12 tokens computed: block 0 is full, block 1 partial. Copy-on-write replaces the partial
    # block; the runner re-reads from the first block that is not full.
    req.num_computed_tokens = 12
    req.block_tables[0][1] = 9
    req.block_tables[0].append(10)
    assert runner._tables.get(req)[0].tolist() == [5, 9, 7, 10]
    # The table grows past the runner's array: still every entry.
    req.num_computed_tokens = 32
    req.block_tables[0].extend(range(11, 31))
    assert runner._tables.get(req)[0].tolist() == req.block_tables[0]
    # Preempted (blocks freed) and readmitted with other blocks: nothing of the old table
    # survives, even entries before num_computed_tokens.
    req.num_preemptions += 1
    req.num_computed_tokens = 0
    req.block_tables = [[4, 3]]
    (got,) = runner._tables.get(req)
    assert got.tolist() == [4, 3] and got.dtype == np.int32


# ------------------------------------------------------------------ the scheduler boundary


def _ran(req: Request, n: int, token: int) -> None:
    """What ``update_from_output`` does to a request after a step (by hand)."""
    req.num_computed_tokens += n
    req.output_token_ids.append(token)


def _step(reqs: list[Request], counts: list[int], **kw) -> SchedulerOutput:
    """A hand-built step in which every request samples."""
    return SchedulerOutput(reqs, counts, sum(counts), [True] * len(reqs), **kw)


@pytest.fixture(scope="module")
def constrained_runner():
    tok = byte_tokenizer()
    return allocated(ModelRunner(tiny_llama(), EngineConfig(num_blocks=32, block_size=8),
                                 frozenset(tok.eos_token_ids), tok._tokenizer)), tok


def test_runner_frees_exactly_what_it_is_told(constrained_runner):
    """The runner forgets a request's block table and matcher when ``finished`` names it, a
    preempted request's table (its matcher stays: its output tokens do), and nothing else,
    whatever a request's status says; a step with no token returns the one empty result."""
    runner, tok = constrained_runner
    digits = SamplingParams(max_tokens=8,
                            structured_outputs=StructuredOutput.make("regex", "[0-9]+"))
    a, b, d = (Request(name, tok.encode(p), digits)
               for name, p in (("a", "ten tokens"), ("b", "twelve token"), ("d", "nine toks")))
    a.block_tables, b.block_tables, d.block_tables = [[1, 2]], [[3, 4]], [[5, 6]]
    first = runner.execute(_step([a, b, d], [10, 12, 9]))
    assert len(first.sampled) == 3
    for req, n, (t,) in zip((a, b, d), (10, 12, 9), first.sampled):
        _ran(req, n, t)
    assert set(runner._tables) == set(runner.grammars._states) == {a.key, b.key, d.key}
    b.status = d.status = RequestStatus.FINISHED_STOPPED  # only b is told
    second = runner.execute(_step([a], [1], finished=[b]))
    assert len(second.sampled) == 1
    assert set(runner._tables) == set(runner.grammars._states) == {a.key, d.key}
    assert runner.execute(_step([], [], finished=[d])) is EMPTY_STEP_RESULT
    assert set(runner._tables) == set(runner.grammars._states) == {a.key}
    assert runner.execute(_step([], [], preempted=[a])) is EMPTY_STEP_RESULT
    assert not runner._tables and set(runner.grammars._states) == {a.key}
    runner.execute(_step([], [], finished=[a]))
    assert not runner.grammars._states


def test_runner_reports_grammar_endings(constrained_runner):
    """After the step's token: ``[0-9]`` is complete (None), ``[0-9]+`` goes on (absent), and a
    request whose output already left its grammar (``x`` for ``[0-9]+``) reports the error."""
    runner, tok = constrained_runner

    def req(name: str, pattern: str, blocks: list[int]) -> Request:
        so = StructuredOutput.make("regex", pattern)
        r = Request(name, tok.encode("Digits: "),
                    SamplingParams(max_tokens=4, structured_outputs=so))
        r.block_tables = [blocks]
        return r

    one, more, gone = (req(n, p, [2 * i + 7, 2 * i + 8]) for i, (n, p) in enumerate(
        [("one", "[0-9]"), ("more", "[0-9]+"), ("gone", "[0-9]+")]))
    gone.output_token_ids = tok.encode("x", add_special_tokens=False)  # recomputed with it
    result = runner.execute(_step([one, more, gone], [r.num_tokens for r in (one, more, gone)]))
    digits = set(tok.encode("0123456789"))
    assert result.sampled[0][0] in digits and result.sampled[1][0] in digits
    assert set(result.grammar_ended) == {one.key, gone.key}  # keyed by the request key
    assert result.grammar_ended[one.key] is None
    assert "satisfy the grammar" in result.grammar_ended[gone.key]  # llguidance's words
    assert result.mask_time_s is not None and result.mask_time_s >= 0
    runner.execute(_step([], [], finished=[one, more, gone]))
