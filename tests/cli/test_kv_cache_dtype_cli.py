"""``--kv-cache-dtype`` / ``--kv-group-size`` on ``mlxpa run``, ``plan`` and ``bench`` with a
tiny gemma3_text folder (3 layers, one KV head of 32, float32 on the CPU). Hand-computed bytes
per token: float32 3 * 2 * 32 * 4 = 768; groups of 32 (one scale and bias of 4 bytes per row):
int8 3 * 2 * (32 + 8) = 240, int4 3 * 2 * (16 + 8) = 144, k8v4 3 * ((32 + 8) + (16 + 8)) = 192."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache
from typer.testing import CliRunner

from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import save_tiny_model

PER_TOKEN = {"auto": 768, "int8": 240, "int4": 144, "k8v4": 192}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", kind="gemma3")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_run_int8_pool_line_and_output(folder, tmp_path):
    model, tok, _ = load_model(EngineConfig(model=folder))
    prompt = "the cat sat on the mat"
    cache = [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    ref = [int(t) for t, _ in generate_step(mx.array(tok.encode(prompt)), model, max_tokens=6,
                                            prompt_cache=cache)]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": prompt}) + "\n")
    out = tmp_path / "out.jsonl"
    r = cli("run", src, "-o", out, "--model", folder, "--max-tokens", 6, "--ignore-eos",
            "--kv-memory", 0.01, "--kv-cache-dtype", "int8", "--kv-group-size", 32)
    assert r.exit_code == 0, r.output
    assert "; int8 (8-bit, group 32, scales float32), 240 bytes per token" in r.stderr
    assert json.loads(out.read_text())["text"] == tok.decode(ref)


def test_run_says_which_caches_keep_the_dtype(folder, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = cli("run", src, "-o", tmp_path / "o.jsonl", "--model", folder, "--max-tokens", 2,
            "--kv-memory", 0.01, "--kv-cache-dtype", "int4")
    assert r.exit_code == 0, r.output
    assert ("float32 (int4 applies to no cache), 768 bytes per token; 3 caches kept in "
            "float32: head width 32/32 is not a multiple of the group size 64 "
            "(--kv-group-size)") in r.stderr


def test_bad_values_are_refused(folder, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = cli("run", src, "--model", folder, "--kv-cache-dtype", "fp8")
    assert r.exit_code == 2 and "'fp8' is not one of" in r.output
    r = cli("run", src, "--model", folder, "--kv-group-size", 48)
    assert r.exit_code == 2 and "--kv-group-size must be one of 32, 64, 128, got 48" in r.output


def test_plan_reports_the_blocks_memory_in_the_chosen_dtype(folder, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": "abcdefgh" * 4 + t}) + "\n"
                           for t in ("x", "yz")))
    r = cli("plan", src, "--model", folder, "--max-tokens", 8, "--kv-cache-dtype", "int4",
            "--kv-group-size", 32, "--kv-memory", 0.001, "--json")
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)
    kv = p["kv_cache"]
    # The tiny gemma3's 3 layers are 3 KV cache groups (a full-attention one, two with an
    # 8-token window): a block holds one layer, a third of a token's bytes.
    assert kv["block_bytes"] == {d: 16 * b // 3 for d, b in PER_TOKEN.items()}
    # Each window group: a request's 3 blocks (34 + 8 tokens), below its window's 18.
    assert kv["pool_blocks_with_sharing"] == p["kv_blocks_with_sharing"] + 2 * 2 * 3
    assert kv["pool_blocks_without_sharing"] == p["kv_blocks_without_sharing"] + 2 * 2 * 3
    assert kv["bytes_with_sharing"] == kv["pool_blocks_with_sharing"] * 16 * 48
    assert kv["bytes_without_sharing"] == kv["pool_blocks_without_sharing"] * 16 * 48
    assert kv["budget_blocks"] == int(0.001 * 2**30) // (16 * 48)
    r = cli("plan", src, "--model", folder, "--kv-cache-dtype", "int4", "--kv-group-size", 32)
    assert r.exit_code == 0, r.output
    assert "KV cache int4 (4-bit, group 32, scales float32), 144 bytes per token" in r.stdout


def test_bench_reports_the_pool_bytes_per_token(folder, tmp_path):
    out = tmp_path / "b.json"
    r = cli("bench", "--model", folder, "--num-prompts", 3, "--input-len", 12, "--output-len", 3,
            "--kv-memory", 0.01, "--baselines", "mlxpa", "--kv-cache-dtype", "k8v4",
            "--kv-group-size", 32, "--json", out)
    assert r.exit_code == 0, r.output
    f = json.loads(out.read_text())["systems"]["mlxpa"]
    assert (f["kv_cache_dtype"], f["kv_bytes_per_token"]) == ("k8v4", 192)
    assert f["kv_bytes"] == f["peak_kv_blocks"] * 16 * 192 // 3  # blocks of one layer
    assert "192 k8v4" in r.stderr
