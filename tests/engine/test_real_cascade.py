"""The real default model (Gemma 3 270M, float32) on ``examples/prompts.jsonl`` (three groups of
rows sharing an instruction prefix): greedy text and tokens identical with cascade attention
on (every group kept, so that it runs on these small groups) and off."""

from __future__ import annotations

import json

import pytest

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import attention, cascade

pytestmark = pytest.mark.real_model


def test_examples_identical_with_and_without_cascade(default_model, monkeypatch):
    model, tok, _ = default_model
    rows = [json.loads(line) for line in open("examples/prompts.jsonl")]
    items = [EngineRequest(str(i), tok.encode(r["prompt"]),
                         SamplingParams(max_tokens=r["max_tokens"], stop=tuple(r["stop"])))
             for i, r in enumerate(rows)]
    monkeypatch.setattr(cascade, "worth_cascading", lambda rows, blocks: True)
    calls = []
    attend = attention.cascade_attention
    monkeypatch.setattr(attention, "cascade_attention",
                        lambda *a, **k: calls.append(1) or attend(*a, **k))
    outs = []
    for on in (True, False):
        engine = LLMEngine(EngineConfig(block_size=16, num_blocks=256,
                                        disable_cascade_attn=not on), model, tok)
        got = sorted(engine.generate(items), key=lambda o: int(o.request_id))
        outs.append([(o.text, o.token_ids) for o in got])
        if on:
            assert calls, "cascade attention never ran"
    assert outs[0] == outs[1]
    assert len(outs[0]) == len(rows)
