"""``build_engine``: the KV pool takes min(budget, what the first window's requests can use),
the budget when more rows follow, on a tiny model, with the need computed by hand from the
tokenizer's own counts; rows over the context size nothing and fail before the model loads."""

from __future__ import annotations

import json

from rich.console import Console

from mlxpa.batch.setup import build_engine
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.tiny_models import save_tiny_model

PROMPTS = ["hello there", "the cat sat on the mat and looked around", "x"]


def _setup(tmp_path, kv_memory, more: bool = False):
    folder = save_tiny_model(tmp_path / "tiny")
    _, tok, _ = load_model(EngineConfig(model=folder))
    requests = [EngineRequest(str(i), tok.encode(p), SamplingParams(max_tokens=5 + i))
                for i, p in enumerate(PROMPTS)]
    config = EngineConfig(model=folder, block_size=4,
                          kv_cache_memory_bytes=int(kv_memory * 2**30))
    console = Console(stderr=True, record=True)
    engine = build_engine(config, requests, more, constrained=False, console=console,
                          verbose=True)
    return tok, engine, console


def test_pool_is_what_the_rows_can_use(tmp_path):
    tok, engine, console = _setup(tmp_path, kv_memory=1.0)
    want = 1 + sum(-(-(len(tok.encode(p)) + 5 + i) // 4) for i, p in enumerate(PROMPTS))
    r = engine.runner
    assert r.num_blocks == want
    assert r.budget_blocks > 100 * want
    text = console.export_text()
    assert f"KV pool: {want - 1} blocks" in text and f"budget {r.budget_blocks - 1}" in text


def test_budget_stays_the_cap(tmp_path):
    _, engine, _ = _setup(tmp_path, kv_memory=1e-6)
    assert engine.runner.num_blocks == engine.runner.budget_blocks >= 2


def test_more_rows_than_the_window_take_the_budget(tmp_path):
    _, engine, _ = _setup(tmp_path, kv_memory=0.01, more=True)
    assert engine.runner.num_blocks == engine.runner.budget_blocks > 100


def test_a_window_sizes_the_pool_and_rows_over_the_context_size_nothing(tmp_path):
    """Window of 2 rows: the pool is the first window's need (the 2nd window's rows read
    later); a prompt over the 4,096-token context gets its error row and no blocks."""
    from mlxpa.batch.run import RunOptions, run_file

    folder = save_tiny_model(tmp_path / "tiny")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "y" * 5000}, {"prompt": "abcdefgh", "max_tokens": 4},
        {"prompt": "abcdefghijklmnop", "max_tokens": 40}]))
    out, console = tmp_path / "out.jsonl", Console(stderr=True, record=True, width=200)
    config = EngineConfig(model=folder, block_size=4, kv_cache_memory_bytes=2**30 // 100)
    run_file(str(src), str(out), config, SamplingParams(ignore_eos=True), console=console)
    # one window: 8 + 4 tokens = 3 blocks of 4, 16 + 40 = 14 blocks, and the null block (the
    # byte tokenizer adds no BOS); the 5,000-character row adds nothing
    want = 1 + 3 + 14
    assert f"KV pool: {want - 1} blocks" in console.export_text()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["error"] == (f"{src} line 1: prompt has 5000 tokens; the limit is 4095 (the "
                                "model context (--max-model-len) holds 4096 tokens)")
    assert [r["completion_tokens"] for r in rows] == [0, 4, 40]
    out.unlink()
    console = Console(stderr=True, record=True, width=200)
    run_file(str(src), str(out), config, SamplingParams(ignore_eos=True), RunOptions(window=2),
             console=console)
    text = console.export_text()  # a second window follows: the budget
    budget = int(text.split("budget ", 1)[1].split(" ", 1)[0])
    assert f"KV pool: {budget} blocks" in text and budget > want

