"""Units of the model runner, each against a hand-computed or sliced oracle: the grouping of
scheduled requests into padded batches, token slices across the prompt/output boundary, and
the incremental block-table sync (copy-on-write of the partial block, a preemption)."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.request import Request
from mlxpa.worker.model_runner import ModelRunner, group_by_length, token_slice
from tests.tiny_models import tiny_llama


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


@pytest.fixture(scope="module")
def runner():
    return ModelRunner(tiny_llama(), EngineConfig(num_blocks=32, block_size=8))


def test_block_table_sync_rereads_the_tail_and_restarts_after_preemption(runner):
    req = Request("r", list(range(3, 23)), SamplingParams(max_tokens=8))  # 20 prompt tokens
    req.block_table = [5, 6, 7]
    assert runner._block_table(req).tolist() == [5, 6, 7]
    # 12 tokens computed: block 0 is full, block 1 partial. Copy-on-write replaces the partial
    # block; the runner re-reads from the first block that is not full.
    req.num_computed_tokens = 12
    req.block_table[1] = 9
    req.block_table.append(10)
    assert runner._block_table(req).tolist() == [5, 9, 7, 10]
    # The table grows past the runner's array: still every entry.
    req.num_computed_tokens = 32
    req.block_table.extend(range(11, 31))
    assert runner._block_table(req).tolist() == req.block_table
    # Preempted (blocks freed) and readmitted with other blocks: nothing of the old table
    # survives, even entries before num_computed_tokens.
    req.num_preemptions += 1
    req.num_computed_tokens = 0
    req.block_table = [4, 3]
    got = runner._block_table(req)
    assert got.tolist() == [4, 3] and got.dtype == np.int32
