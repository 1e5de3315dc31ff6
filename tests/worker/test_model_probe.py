"""The geometry probe and load-time refusals.

Oracles: the tiny models' own configuration values (hand-set head counts and sizes), and
``UnsupportedModelError`` for architectures whose attention the paged path cannot run.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.errors import UnsupportedModelError
from mlxpa.worker.model_probe import probe_model
from mlxpa.worker.model_runner import ModelRunner
from tests.loader.tiny_archs import build, config
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama


def test_gemma3_geometry_and_windows():
    geo = probe_model(tiny_gemma3(sliding_window=8))  # 1 KV head of 32, pattern 3
    assert [c.shape for c in geo.caches] == [(1, 32, 32)] * 3
    assert geo.windows == [8, 8, None]
    assert geo.dtype == mx.float32


def test_k_and_v_widths_differ_per_model():
    """youtu_llm (MLA, non-absorbed): keys are nope + rope wide, values v_head_dim."""
    cfg = config("youtu_llm")
    geo = probe_model(build("youtu_llm"))
    k_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    assert {c.shape for c in geo.caches} == {(cfg["num_attention_heads"], k_dim,
                                               cfg["v_head_dim"])}


def test_head_size_differs_per_layer():
    """gemma4_text: sliding layers use head_dim, full-attention layers global_head_dim; each
    cache entry gets a pool of its own shape."""
    cfg = config("gemma4_text")
    model = build("gemma4_text")
    runner = ModelRunner(model, EngineConfig(block_size=8, num_blocks=4))
    runner.allocate_kv_cache(runner.budget_blocks)
    dims = {c.k_dim for c in runner.geometry.caches}
    assert dims == {cfg["head_dim"], cfg["global_head_dim"]}
    for pool, c in zip(runner.kv_cache.key_caches, runner.geometry.caches):
        assert pool.shape == (4, c.kv_heads, 8, c.k_dim)


def test_dtype_of_a_half_model():
    model = tiny_llama()
    model.set_dtype(mx.bfloat16)
    assert probe_model(model).dtype == mx.bfloat16


@pytest.mark.parametrize("name,reason", [
    ("gemma2", "does not go through mlx-lm's scaled_dot_product_attention"),
    ("llama4", "ChunkedKVCache"),
    ("phi3small", "outside scaled_dot_product_attention"),
    ("deepseek_v32", "sparse-attention indexer"),
])
def test_refused_with_reason(name, reason):
    with pytest.raises(UnsupportedModelError) as err:
        ModelRunner(build(name), EngineConfig(block_size=8, num_blocks=4))
    assert err.value.model_type == name
    assert reason in str(err.value)


def test_cli_prints_one_line(tmp_path):
    """An unsupported model folder: exit 1, one ``error:`` line, no traceback, nothing run."""
    folder = tmp_path / "gemma2"
    folder.mkdir()
    model = build("gemma2")
    (folder / "config.json").write_text(json.dumps({**config("gemma2"), "eos_token_id": 1}))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    byte_tokenizer()._tokenizer.save_pretrained(str(folder))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["run", str(prompts), "-o", str(out), "--model",
                                      str(folder), "-q", "--kv-memory", "0.01"])
    assert result.exit_code == 1
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert lines == ["error: model type 'gemma2' is not supported: its attention does not go "
                     "through mlx-lm's scaled_dot_product_attention"]
    assert "Traceback" not in result.output
    assert not out.exists() or out.read_text() == ""


def test_cache_lists_open_into_entries():
    """Falcon-H1 keeps ``CacheList(ArraysCache(2), KVCache)`` per layer: two entries each,
    the state one without a pool, and a layout that rebuilds the lists."""
    geometry = probe_model(build("falcon_h1"))
    assert geometry.layout == [(0, 1), (2, 3)]
    assert [c.state_size for c in geometry.caches] == [2, 0, 2, 0]
    assert [c.kv_heads for c in geometry.caches] == [0, 2, 0, 2]
    assert geometry.recurrent == [0, 2] and geometry.has_kv


@pytest.mark.parametrize("name", ["deepseek_v3", "plamo"])
def test_latent_and_repeated_kv_are_gathered(name):
    """MLA caches the latent and the RoPE key (1 head) and attends over K/V computed from
    them; plamo repeats its K/V heads: the probe marks such entries ``gathered`` with the
    cached geometry."""
    geometry = probe_model(build(name))
    assert any(c.gathered for c in geometry.caches)
    if name == "deepseek_v3":
        c = geometry.caches[0]
        assert (c.kv_heads, c.k_dim, c.v_dim) == (1, 16, 8)  # kv_lora_rank, qk_rope_head_dim
