"""``LLM.generate_iter``: an input iterator that is never materialised (a generator that fails
when it is read more than a window ahead of the outputs), outputs in input order or as they
finish, equal to ``LLM.generate``'s; a bad item gets its error in its place; leaving a stream
early aborts its prompts and the next call runs clean."""

from __future__ import annotations

import itertools

import pytest

from mlxpa import LLM, SamplingParams
from tests.entrypoints.conftest import KV_BYTES

PARAMS = SamplingParams(max_tokens=5)
WINDOW, MAX_NUM_SEQS = 3, 2


@pytest.fixture(scope="module")
def small(folder):
    """An LLM running at most 2 requests at once (its waiting queue: 4)."""
    return LLM(folder, kv_cache_memory_bytes=KV_BYTES, max_num_seqs=MAX_NUM_SEQS)


def prompt(i: int) -> str:
    return f"row {i}: " + "abc"[i % 3] * (1 + i % 4)


class Bounded:
    """Prompts 0..n-1 from a generator that fails when read ahead of the outputs by more than
    one window plus what the engine holds (``max_num_seqs`` running, twice that waiting)."""

    def __init__(self, n: int, items=prompt) -> None:
        self.n, self.items, self.read, self.done = n, items, 0, 0

    def __iter__(self):
        for i in range(self.n):
            assert self.read - self.done < WINDOW + 3 * MAX_NUM_SEQS, "read too far ahead"
            self.read += 1
            yield self.items(i)


def test_in_order_and_as_finished_equal_generate(small):
    want = [o.outputs[0].token_ids for o in small.generate([prompt(i) for i in range(20)],
                                                           PARAMS, use_tqdm=False)]
    for ordered in (True, False):
        source = Bounded(20)
        got = []
        for out in small.generate_iter(source, PARAMS, ordered=ordered, window=WINDOW):
            source.done += 1
            got.append((int(out.request_id), out.outputs[0].token_ids))
        if ordered:
            assert [i for i, _ in got] == list(range(20))
        assert sorted(got) == list(enumerate(want))


def test_the_input_is_never_materialised(small):
    """A generator that fails once read too far ahead: the assertion inside it would stop
    the stream (it propagates), so reaching the end proves the bound held."""
    source = Bounded(30)
    for _ in small.generate_iter(iter(source), PARAMS, window=WINDOW):
        source.done += 1
    assert source.read == 30 and source.done == 30
    hungry = Bounded(30)  # never counts outputs: read too far ahead, the stream fails
    with pytest.raises(AssertionError, match="read too far ahead"):
        list(small.generate_iter(hungry, PARAMS, window=WINDOW))
    assert not small.llm_engine.has_unfinished_requests()


def test_a_bad_item_gets_its_error_in_place(small):
    items = ["a", 7, {"prompt": "b", "temperature": -2}, {"prompt": "c", "id": "c"}]
    outs = list(small.generate_iter(items, PARAMS))
    assert [o.request_id for o in outs] == ["0", "1", "2", "c"]
    assert outs[1].error == ("prompts[1]: expected a string, a list of token ids or a dict (a row "
                             "of mlxpa run), got int")
    assert outs[2].error == ('prompts[2]: field "temperature" must be a finite number >= 0, got '
                             "-2")
    assert outs[1].outputs == outs[2].outputs == [] and outs[3].error is None
    assert small.llm_engine.counters.failed_rows == 2
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        small.generate_iter(["a"], window=0)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams, got list"):
        small.generate_iter(["a"], [PARAMS])


def test_leaving_a_stream_early_aborts_its_prompts(small):
    want = [o.outputs[0].token_ids for o in small.generate(["x", "y"], PARAMS, use_tqdm=False)]
    stream = small.generate_iter((prompt(i) for i in itertools.count()), PARAMS, window=WINDOW)
    assert next(stream).request_id == "0"
    stream.close()  # requests were in flight
    assert not small.llm_engine.has_unfinished_requests()
    small.llm_engine.kv_cache_manager.check_invariants([])
    assert [o.outputs[0].token_ids for o in small.generate(["x", "y"], PARAMS,
                                                           use_tqdm=False)] == want


def test_a_later_call_takes_the_engine_over(small):
    stream = small.generate_iter((prompt(i) for i in range(10)), PARAMS, window=WINDOW)
    next(stream)
    (out,) = small.generate("x", PARAMS, use_tqdm=False)  # drops the open stream's prompts
    assert out.error is None
    with pytest.raises(RuntimeError, match="another call on this LLM started"):
        next(stream)
    assert not small.llm_engine.has_unfinished_requests()
