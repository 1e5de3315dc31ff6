"""``AsyncLLM``: the engine in its own thread behind asyncio, on a tiny random llama built in
that thread. Oracles: the offline engine (``LLMEngine.generate``) on the same model and
requests; the engine's own block counts (every block back once a request is dropped)."""

from __future__ import annotations

import asyncio
import time

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.async_llm import AsyncLLM, EngineDeadError, QueueFullError
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import RequestOutputKind, SamplingParams
from tests.tiny_models import byte_tokenizer, tiny_llama

TOK = byte_tokenizer()
CONFIG = EngineConfig(block_size=8, num_blocks=300, max_num_seqs=8, max_num_batched_tokens=64)
DELTA = RequestOutputKind.DELTA


def _factory(config: EngineConfig = CONFIG):
    return lambda: LLMEngine(config, tiny_llama(), TOK)


def _request(rid: str, prompt: str, stream: bool = False, **params) -> EngineRequest:
    kind = DELTA if stream else RequestOutputKind.FINAL_ONLY
    return EngineRequest(rid, TOK.encode(prompt), SamplingParams(output_kind=kind, **params))


REQUESTS = [_request("a", "the cat sat on the mat", max_tokens=20),
            _request("b", "the cat sat on a hat", stream=True, max_tokens=24, stop=("e",)),
            _request("c", "hello world", stream=True, n=3, seed=4, temperature=1.0,
                     max_tokens=16),
            _request("d", "0123456789", max_tokens=0),
            _request("e", "x" * 400, stream=True, max_tokens=5)]


async def _texts(llm: AsyncLLM, request: EngineRequest) -> dict[int, str]:
    texts: dict[int, str] = {}
    async for out in llm.generate(request):
        texts[out.sample_index] = texts.get(out.sample_index, "") + out.text
    return texts


def _wait(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_concurrent_requests_get_what_the_offline_engine_gives():
    offline = LLMEngine(CONFIG, tiny_llama(), TOK)
    want: dict[str, dict[int, str]] = {}
    for out in offline.generate(r._replace(sampling_params=SamplingParams(
            **{**_params(r), "output_kind": RequestOutputKind.FINAL_ONLY})) for r in REQUESTS):
        want.setdefault(out.request_id, {})[out.sample_index] = out.text
    llm = AsyncLLM(CONFIG, engine_factory=_factory()).start()
    try:
        async def main():
            return await asyncio.gather(*(_texts(llm, r) for r in REQUESTS))

        got = asyncio.run(main())
    finally:
        llm.shutdown()
    assert dict(zip((r.request_id for r in REQUESTS), got)) == want
    assert len(want["c"]) == 3


def _params(request: EngineRequest) -> dict:
    p = request.sampling_params
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


def test_closing_the_stream_aborts_and_frees_the_blocks():
    seen: list = []
    llm = AsyncLLM(CONFIG, engine_factory=_factory(),
                   on_finished=lambda out, e2e: seen.append(out)).start()
    try:
        async def leave_early():
            outputs = llm.generate(_request("long", "a prompt " * 10, stream=True,
                                            max_tokens=200, ignore_eos=True))
            for _ in range(3):
                out = await anext(outputs)
                assert not out.finished
            await outputs.aclose()

        asyncio.run(leave_early())
        _wait(lambda: llm.stats.kv_blocks_in_use == 0 and llm.stats.num_running == 0)
        assert llm.engine.kv_cache_manager.num_active_blocks == 0
        assert llm.stats.counters.generation_tokens < 200 and not seen  # no finished output
        texts = asyncio.run(_texts(llm, _request("next", "hi", max_tokens=4)))
        assert len(texts[0]) > 0 and len(seen) == 1  # still serving; e2e observed
    finally:
        llm.shutdown()


def test_a_full_waiting_queue_refuses_more():
    config = EngineConfig(block_size=8, num_blocks=300, max_num_seqs=1)
    llm = AsyncLLM(config, max_num_waiting=1, engine_factory=_factory(config)).start()
    try:
        async def main():
            running = llm.generate(_request("run", "a", max_tokens=300, ignore_eos=True,
                                            stream=True))
            await anext(running)  # it runs: the only slot is taken
            waiting = llm.generate(_request("wait", "b", max_tokens=2))
            task = asyncio.ensure_future(anext(waiting))
            await asyncio.sleep(0.05)
            with pytest.raises(QueueFullError, match="--max-num-waiting"):
                await anext(llm.generate(_request("more", "c", max_tokens=2)))
            await running.aclose()  # the slot frees: the waiting one runs
            assert (await task).finished
        asyncio.run(main())
    finally:
        llm.shutdown()


def test_a_failing_step_fails_every_caller_and_the_engine_reports_dead(capfd):
    def broken() -> LLMEngine:
        engine = _factory()()
        engine.step = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
        return engine

    llm = AsyncLLM(CONFIG, engine_factory=broken).start()
    with pytest.raises(EngineDeadError, match="RuntimeError: boom"):
        asyncio.run(_texts(llm, _request("x", "hi", max_tokens=4)))
    _wait(lambda: not llm.is_alive)
    with pytest.raises(EngineDeadError):
        asyncio.run(_texts(llm, _request("y", "hi", max_tokens=4)))
    err = capfd.readouterr().err  # the traceback is in the server's log
    assert "Traceback" in err and "RuntimeError: boom" in err


def test_a_build_error_comes_out_of_start():
    def missing() -> LLMEngine:
        raise FileNotFoundError("no model folder /nowhere")

    with pytest.raises(FileNotFoundError, match="/nowhere"):
        AsyncLLM(CONFIG, engine_factory=missing).start()


def test_shutdown_tells_the_callers_in_flight():
    llm = AsyncLLM(CONFIG, engine_factory=_factory()).start()

    async def main():
        outputs = llm.generate(_request("long", "a", stream=True, max_tokens=3000,
                                        ignore_eos=True))
        await anext(outputs)
        await asyncio.to_thread(llm.shutdown)
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in outputs:
                pass

    asyncio.run(main())
    assert not llm.is_alive
