"""The streaming core (``RequestStream``, ``in_input_order``, ``windows``) on a tiny random
llama: each item's samples grouped whole (greedy ids equal to mlx-lm's own generation), an
item that cannot run set aside and handed back in its place (before the engine's next output),
each window admitted in prefix order, the input read at most one window ahead of the engine,
results put back in input order."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.stream import Finished, RequestStream, in_input_order, windows
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_llama

TOK = byte_tokenizer(eos_id=-1)  # no EOS: every request runs max_tokens


class Item(NamedTuple):
    index: int
    request: EngineRequest | None


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _item(i: int, text: str | None, params=None) -> Item:
    if text is None:
        return Item(i, None)
    return Item(i, EngineRequest(f"r{i}", TOK.encode(text),
                                 params or SamplingParams(max_tokens=4)))


def test_an_item_that_cannot_run_comes_back_in_its_place(model):
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64), model, TOK)
    items = [Item(0, None), _item(1, "ab", SamplingParams(max_tokens=2)), Item(2, None)]
    got = list(RequestStream(eng).run([items]))
    # both read with the window, handed back before the engine's first output
    assert got[:2] == [Finished(items[0], []), Finished(items[2], [])]
    assert len(got) == 3 and got[2].item is items[1]
    assert [o.request_id for o in got[2].outputs] == ["r1"]
    alone = list(RequestStream(eng).run([[Item(0, None)]]))  # nothing for the engine at all
    assert alone == [Finished(Item(0, None), [])]


def test_items_grouped_whole_in_prefix_order_errors_in_place(model):
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=128, max_num_seqs=2), model, TOK)
    texts = ["shared prefix a", "zzz other", "shared prefix b", None, "shared prefix c"]
    items = [_item(i, t, SamplingParams(max_tokens=5, n=2 if i == 1 else 1, temperature=1.0
                                        if i == 1 else 0.0, seed=3))
             for i, t in enumerate(texts)]
    admitted = []
    add = eng.add_request

    def spy(request_id, *rest):
        admitted.append(request_id)
        return add(request_id, *rest)

    eng.add_request = spy
    results = list(RequestStream(eng).run(windows(items, 5)))
    assert admitted == ["r0", "r2", "r4", "r1"]  # the window's prefix order: shared together
    assert results[0] == Finished(items[3], [])  # the error item, before the first output
    by_index = {r.item.index: r.outputs for r in results}
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    assert [o.sample_index for o in by_index[1]] == [0, 1]
    for i in (0, 2, 4):
        ids = TOK.encode(texts[i])
        want = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=5)]
        assert by_index[i][0].token_ids == want
    ordered = list(in_input_order(iter(results), lambda item: item.index))
    assert [r.item.index for r in ordered] == [0, 1, 2, 3, 4]


def test_the_input_is_read_at_most_one_window_ahead(model):
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=256, max_num_seqs=2), model, TOK)
    size, read = 3, []

    def items():
        for i in range(20):
            read.append(i)
            yield _item(i, None if i % 7 == 3 else f"prompt {i} " + "x" * (i % 5))

    done = 0
    for _ in RequestStream(eng, "input").run(windows(items(), size)):
        done += 1
        # in the engine: max_num_seqs running + 2 * max_num_seqs waiting; then one window
        assert len(read) <= done + 3 * 2 + size
    assert done == 20
    assert list(windows([], 3)) == [] and [len(w) for w in windows(range(7), 3)] == [3, 3, 1]
