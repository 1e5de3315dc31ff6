"""Start-up in vLLM's two phases: the model is probed and checked against mlx-lm once per
``LLM`` and once per ``mlxpa run`` (counted), and the engine's KV pool is resized without
rebuilding the runner; outputs after a resize still equal mlx-lm's own greedy generation."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker import load_check, model_probe
from tests.tiny_models import byte_tokenizer, save_tiny_model, tiny_llama

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def mlx_lm_greedy(model, ids: list[int], n: int) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


@pytest.fixture
def counted(monkeypatch) -> dict[str, int]:
    """Calls of the model probe and of the load check against mlx-lm, wherever mlxpa calls
    them from: every loaded mlxpa module holding either function gets a counting one."""
    import sys

    calls = {"probe": 0, "check": 0}
    real = {"probe": model_probe.probe_model, "check": load_check.verify_and_split}

    def counting(name):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real[name](*args, **kwargs)
        return wrapper

    wrappers = {name: counting(name) for name in real}
    for module in [m for n, m in sys.modules.items() if n.startswith("mlxpa")]:
        for attr, value in list(vars(module).items()):
            name = next((k for k, f in real.items() if value is f), None)
            if name is not None:
                monkeypatch.setattr(module, attr, wrappers[name])
    return calls


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def drain(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Every prompt to the end through ``add_request`` and ``step``; token ids by id."""
    for i, ids in enumerate(prompts):
        assert engine.add_request(str(i), ids, PARAMS) is None
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o.token_ids for o in engine.step()})
    return outs


def test_llm_probes_and_checks_the_model_once_while_its_pool_grows(folder, counted):
    from mlx_lm import load

    from mlxpa import LLM

    llm = LLM(folder, kv_cache_memory_bytes=2**22, kv_segment_bytes=2**14)  # 2 blocks
    runner = llm.llm_engine.runner
    sizes = [runner.num_blocks]
    prompts = ["x" * 20, "the cat sat on the mat " * 3, "hello world, " * 12]
    outs = []
    for k in range(1, 4):  # each call needs more blocks than the last
        outs += llm.generate(prompts[:k], PARAMS, use_tqdm=False)
        sizes.append(runner.num_blocks)
    assert counted == {"probe": 1, "check": 1}
    assert llm.llm_engine.runner is runner and sizes == sorted(set(sizes)) and len(sizes) == 4
    model, tok = load(folder)
    for out in outs:
        want = mlx_lm_greedy(model, tok.encode(out.prompt), PARAMS.max_tokens)
        assert out.outputs[0].token_ids == want


def test_mlxpa_run_probes_and_checks_the_model_once(folder, tmp_path, counted):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": "row " * (i + 1)}) + "\n" for i in range(5)))
    r = CliRunner().invoke(app, ["run", str(src), "-o", str(tmp_path / "out.jsonl"),
                                 "--model", folder, "--max-tokens", "3", "--kv-memory",
                                 "0.01", "-q"])
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5
    assert counted == {"probe": 1, "check": 1}


def test_resize_rebuilds_the_pool_not_the_runner(counted):
    model, tok = tiny_llama(), byte_tokenizer(eos_id=-1)
    prompts = [tok.encode(p) for p in ("hello world, this is a test", "a", "0123456789abcde")]
    refs = {str(i): mlx_lm_greedy(model, p, PARAMS.max_tokens) for i, p in enumerate(prompts)}
    engine = LLMEngine(EngineConfig(block_size=8, kv_cache_memory_bytes=2**22), model, tok,
                       kv_blocks_needed=7)
    runner = engine.runner
    assert runner.num_blocks == 7 and engine.kv_cache_manager.pool.num_blocks == 7
    assert drain(engine, prompts) == refs  # 6 usable blocks for the 9 the prompts can use
    engine.resize_kv_pool(12)
    assert (runner.num_blocks, engine.kv_cache_manager.pool.num_blocks) == (12, 12)
    assert engine.runner is runner and runner.kv_cache.key_caches[0].shape[0] == 12
    assert drain(engine, prompts) == refs
    engine.kv_cache_manager.check_invariants([])
    assert counted == {"probe": 1, "check": 1}


def test_resize_waits_for_an_idle_engine():
    model, tok = tiny_llama(), byte_tokenizer(eos_id=-1)
    engine = LLMEngine(EngineConfig(block_size=8, num_blocks=16), model, tok)
    engine.add_request("0", tok.encode("hello world"), PARAMS)
    engine.step()
    with pytest.raises(RuntimeError, match="no request in flight"):
        engine.resize_kv_pool(32)
    assert engine.runner.num_blocks == 16
    engine.abort_unfinished()
    engine.resize_kv_pool(32)
    assert engine.runner.num_blocks == 32
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        engine.resize_kv_pool(1)
