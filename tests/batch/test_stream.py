"""The streaming core (``RowStream``, ``in_input_order``) and the engine's ``Passthrough``, on
a tiny random llama: each row's samples grouped whole (greedy ids equal to mlx-lm's own
generation), a row that cannot run handed back where it was pulled, each window admitted in
prefix order, the input read at most one window ahead of the engine, results put back in
input order."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.batch.requests import Fed, windows
from mlxpa.batch.stream import RowResult, RowStream, in_input_order
from mlxpa.config import EngineConfig
from mlxpa.data import Row
from mlxpa.engine import LLMEngine, Passthrough, PromptInput
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_llama

TOK = byte_tokenizer(eos_id=-1)  # no EOS: every request runs max_tokens


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _fed(i: int, text: str | None, params=None) -> Fed:
    row = Row(i, f"r{i}", text, None, {})
    if text is None:
        return Fed(row, error=f"row {i}: bad")
    return Fed(row, PromptInput(i, TOK.encode(text), params or SamplingParams(max_tokens=4)))


def test_engine_hands_a_passthrough_back_when_it_is_pulled(model):
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64), model, TOK)
    items = [Passthrough("first"), PromptInput(0, TOK.encode("ab"), SamplingParams(max_tokens=2)),
             Passthrough("second")]
    outs = list(eng.generate(items))
    assert outs[:2] == [Passthrough("first"), Passthrough("second")]  # pulled before any step
    assert len(outs) == 3 and outs[2].request_id == 0


def test_rows_grouped_whole_in_prefix_order_errors_in_place(model):
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=128, max_num_seqs=2), model, TOK)
    texts = ["shared prefix a", "zzz other", "shared prefix b", None, "shared prefix c"]
    feds = [_fed(i, t, SamplingParams(max_tokens=5, n=2 if i == 1 else 1, temperature=1.0
                                      if i == 1 else 0.0, seed=3))
            for i, t in enumerate(texts)]
    admitted = []
    add = eng.add_request

    def spy(request_id, *rest):
        admitted.append(request_id)
        return add(request_id, *rest)

    eng.add_request = spy
    results = list(RowStream(eng).run(windows(feds, 5)))
    assert admitted == [0, 2, 4, 1]  # the window's prefix order: the shared rows together
    assert results[0] == RowResult(feds[3], [])  # the error row, when its window was pulled
    by_index = {r.fed.row.index: r.outputs for r in results}
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    assert [o.sample_index for o in by_index[1]] == [0, 1]
    for i in (0, 2, 4):
        ids = TOK.encode(texts[i])
        want = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=5)]
        assert by_index[i][0].token_ids == want
    ordered = list(in_input_order(iter(results)))
    assert [r.fed.row.index for r in ordered] == [0, 1, 2, 3, 4]


def test_the_input_is_read_at_most_one_window_ahead(model):
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=256, max_num_seqs=2), model, TOK)
    size, read = 3, []

    def rows():
        for i in range(20):
            read.append(i)
            yield _fed(i, None if i % 7 == 3 else f"prompt {i} " + "x" * (i % 5))

    done = 0
    for _ in RowStream(eng, "input").run(windows(rows(), size)):
        done += 1
        # in the engine: max_num_seqs running + 2 * max_num_seqs waiting; then one window
        assert len(read) <= done + 3 * 2 + size
    assert done == 20
