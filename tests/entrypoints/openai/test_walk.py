"""Walk (a) of the request-schema review, measured: a chat body's ``temperature`` from the bytes
the server reads to the sampler. Every function called with the value (or a
``SamplingParams``, or a tuple of them, that holds it) is recorded, in every thread, while the
request runs on a live engine: the value passes through at most 9 files, one way (the server's
request module, the request schema and input processor, the engine, the worker), is merged
with the defaults once and checked by its range rule once."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
from pathlib import Path

import mlxpa
from mlxpa import sampling_params as sp
from mlxpa.config import EngineConfig
from mlxpa.engine.async_llm import AsyncLLM
from mlxpa.entrypoints.openai.requests import engine_request
from mlxpa.inputs import InputProcessor
from mlxpa.sampling_params import SamplingParams
from tests.entrypoints.openai.conftest import ENGINE

T = 0.7312  # the body's temperature: a value nothing else in the run has
PACKAGE = Path(mlxpa.__file__).parent
PIPELINE = ("entrypoints", "inputs", "engine", "worker")  # the way a request goes


def _carries(value, depth: int = 0) -> bool:
    """The value itself, a ``SamplingParams`` holding it, or a tuple or list of them (an
    ``EngineRequest``, a step's parameters); not a whole body or row, which every field
    reader is handed."""
    if isinstance(value, float) and value == T:
        return True
    if isinstance(value, SamplingParams):
        return value.temperature == T
    if depth < 2 and isinstance(value, (list, tuple)):
        return any(_carries(v, depth + 1) for v in value[:64])
    return False


def test_temperature_goes_one_way_through_at_most_nine_files(folder, monkeypatch):
    files: list[str] = []
    edges: set[tuple[str, str]] = set()  # (caller, callee) of each call that hands it on
    counts = {"merged": 0, "rule": 0, "replace": 0}
    active = threading.Event()

    def hook(frame, event, arg):
        if event != "call" or not active.is_set():
            return
        path = frame.f_code.co_filename
        if not path.startswith(str(PACKAGE)) or not any(
                _carries(v) for v in list(frame.f_locals.values())[:frame.f_code.co_argcount]):
            return
        name = str(Path(path).relative_to(PACKAGE))
        if name not in files:
            files.append(name)
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller.startswith(str(PACKAGE)):
            edges.add((str(Path(caller).relative_to(PACKAGE)), name))

    ok, wanted = sp._RULES["temperature"]

    def rule(value):
        counts["rule"] += value == T
        return ok(value)

    merged, replace = SamplingParams.merged, dataclasses.replace

    def counted_merged(self, overrides):
        counts["merged"] += 1
        return merged(self, overrides)

    def counted_replace(obj, **changes):
        counts["replace"] += isinstance(obj, SamplingParams)
        return replace(obj, **changes)

    monkeypatch.setitem(sp._RULES, "temperature", (rule, wanted))
    monkeypatch.setattr(SamplingParams, "merged", counted_merged)
    monkeypatch.setattr(dataclasses, "replace", counted_replace)
    threading.setprofile(hook)
    llm = AsyncLLM(EngineConfig(model=folder, **ENGINE))
    llm.start()
    try:
        engine = llm.engine
        processor = InputProcessor(engine.tokenizer, engine.runner.vocab_size,
                                   engine.max_model_len)
        defaults = SamplingParams(temperature=1.0, max_tokens=engine.max_model_len)
        raw = (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": %r, '
               b'"max_tokens": 3, "seed": 1}' % T)

        async def walk() -> list:
            served = engine_request("chat", raw, "chatcmpl-walk", processor, defaults, "tiny")
            return [out async for out in llm.generate(served.request)]

        active.set()
        sys.setprofile(hook)
        try:
            outs = asyncio.run(walk())
        finally:
            sys.setprofile(None)
            active.clear()
    finally:
        threading.setprofile(None)
        llm.shutdown()
    assert len(outs) == 1 and outs[0].error is None and len(outs[0].token_ids) == 3
    assert counts == {"merged": 1, "rule": 1, "replace": 0}
    assert len(files) <= 9, files
    assert {"entrypoints/openai/requests.py", "inputs/schema.py", "sampling_params.py",
            "inputs/processor.py", "engine/async_llm.py", "engine/llm_engine.py",
            "worker/topk_topp_sampler.py"} <= set(files), files

    def stage(file: str) -> int | None:  # root modules are libraries every stage calls
        return PIPELINE.index(file.split("/")[0]) if "/" in file else None

    back = [(a, b) for a, b in edges
            if None not in (stage(a), stage(b)) and stage(b) < stage(a)]
    assert not back, back  # no stage hands it back to an earlier one
