"""``build_engine``: the KV pool takes min(budget, what the rows can use), on a tiny model,
with the need computed by hand from the tokenizer's own counts."""

from __future__ import annotations

from rich.console import Console

from mlxpa.batch.setup import build_engine
from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.data.read import read_rows
from mlxpa.data.validate import validate
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

PROMPTS = ["hello there", "the cat sat on the mat and looked around", "x"]


def _setup(tmp_path, kv_memory):
    folder = save_tiny_model(tmp_path / "tiny")
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"prompt": "{p}", "max_tokens": {5 + i}}}\n'
                            for i, p in enumerate(PROMPTS)))
    rows = lambda: read_rows(str(path))  # noqa: E731
    defaults = SamplingParams()
    v = validate(rows(), source=str(path), unit="line", defaults=defaults)
    config = EngineConfig(model=folder, block_size=4, kv_memory_gib=kv_memory)
    console = Console(stderr=True, record=True)
    return folder, build_engine(config, rows(), v, defaults, console, True), console


def test_pool_is_what_the_rows_can_use(tmp_path):
    folder, engine, console = _setup(tmp_path, kv_memory=1.0)
    _, tok, _ = load_model(folder)
    want = 1 + sum(-(-(len(tok.encode(p)) + 5 + i) // 4) for i, p in enumerate(PROMPTS))
    r = engine.runner
    assert r.num_blocks == want
    assert r.budget_blocks > 100 * want
    text = console.export_text()
    assert f"KV pool: {want - 1} blocks" in text and f"budget {r.budget_blocks - 1}" in text


def test_budget_stays_the_cap(tmp_path):
    _, engine, _ = _setup(tmp_path, kv_memory=1e-6)
    assert engine.runner.num_blocks == engine.runner.budget_blocks >= 2


def test_interrupted_report_counts_what_was_written(tmp_path):
    """After a stop request the report's prompt tokens are those of the rows in the file,
    and the requests dropped in flight are said (the issue saw 1,432 counted, 1,022 written)."""
    import json

    from mlxpa.batch.run import RunOptions, run_file

    folder = save_tiny_model(tmp_path / "tiny")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"row {i} " + "x" * (5 + i)}) + "\n"
                           for i in range(8)))
    out = tmp_path / "out.jsonl"
    polls = iter(range(10**6))
    console = Console(stderr=True, record=True, width=200)
    config = EngineConfig(model=folder, max_num_seqs=2, kv_memory_gib=0.01)
    stats = run_file(str(src), str(out), config, SamplingParams(max_tokens=6, ignore_eos=True),
                     RunOptions(order="input"), console=console,
                     should_stop=lambda: next(polls) >= 12)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) < 8
    assert stats.prompt_tokens == sum(r["prompt_tokens"] for r in rows)
    text = console.export_text()
    assert "interrupted: dropped" in text and f"wrote {len(rows)} row(s) to {out}" in text
