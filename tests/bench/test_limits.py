"""The matmul limit: FLOPs per token counted by hand on tiny models (plain, tied, quantized),
the work of a run, the fraction of the limit, and ``mlxpa bench --workload limits``."""

from __future__ import annotations

import json

import mlx.nn as nn
import pytest
from typer.testing import CliRunner

from mlxpa.bench.flops import ModelFlops, model_flops
from mlxpa.bench.limits import gemm_flops_per_s, limit_fraction, run_limits
from mlxpa.cli import app
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.tiny_models import byte_tokenizer, save_tiny_model, tiny_gemma3, tiny_llama

# tiny_llama: hidden 64, 2 layers, MLP 128, 4 heads of 16, 2 KV heads, vocab 256.
# Per layer q 64x64 + k 64x32 + v 64x32 + o 64x64 + gate, up, down 3 x 64x128 = 36,864.
LLAMA_BODY = 2 * 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)
# tiny_gemma3: hidden 64, 3 layers, MLP 128, 4 heads of 32, 1 KV head: q 64x128 + k 64x32 +
# v 64x32 + o 128x64 + MLP 3 x 64x128 = 45,056 per layer.
GEMMA_BODY = 2 * 3 * (64 * 128 + 64 * 32 + 64 * 32 + 128 * 64 + 3 * 64 * 128)
HEAD = 2 * 256 * 64


@pytest.mark.parametrize("make,body", [
    (lambda: tiny_llama(), LLAMA_BODY),
    (lambda: tiny_llama(tie=True), LLAMA_BODY),   # head = the tied embedding
    (lambda: tiny_gemma3(), GEMMA_BODY),
])
def test_model_flops_by_hand(make, body):
    assert LLAMA_BODY == 147_456 and GEMMA_BODY == 270_336
    f = model_flops(make())
    assert (f.body, f.head) == (body, HEAD)
    assert (f.prefill, f.decode) == (body, body + HEAD)


def test_quantized_weights_count_their_logical_shape():
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    assert isinstance(model.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert model_flops(model) == ModelFlops(LLAMA_BODY, HEAD)


def test_work_and_fraction_by_hand():
    f = ModelFlops(body=10, head=100)
    # 50 prompt tokens, 3 requests generating 4 each: 12 heads, 12 - 3 tokens fed back.
    assert f.work(50, 12, 3) == (50 + 9) * 10 + 12 * 100
    figures = {"elapsed_s": 2.0, "generation_tokens": 12, "cached_prompt_tokens": 20}
    # 30 computed prompt tokens: (30 + 9) * 10 + 1200 = 1590 FLOPs at 100 FLOP/s in 2 s.
    assert limit_fraction(figures, 50, 3, f, 100.0) == pytest.approx(1590 / 100 / 2)
    del figures["cached_prompt_tokens"]
    assert limit_fraction(figures, 50, 3, f, 100.0) == pytest.approx(1790 / 100 / 2)


def test_gemm_rate_matches_its_definition():
    rate = gemm_flops_per_s(n=128, runs=2)
    assert 1e6 < rate < 1e14   # 2 * 128^3 FLOPs took between 0.04 us and 4 s


def test_run_limits_rows():
    model, tok = tiny_llama(), byte_tokenizer()
    f = model_flops(model)
    rows = run_limits(model, tok, EngineConfig(kv_cache_memory_bytes=2**30 // 100), f, 1e9,
                      prefill=(3, 40), decode=(4, 5, 6))
    assert [r.phase for r in rows] == ["prefill", "decode"]
    assert rows[0].tokens == 120 and rows[1].tokens == 4 * 5
    assert rows[0].limit_tokens_per_s == pytest.approx(1e9 / LLAMA_BODY)
    assert rows[1].limit_tokens_per_s == pytest.approx(1e9 / (LLAMA_BODY + HEAD))
    for r in rows:
        assert r.seconds > 0
        assert r.fraction == pytest.approx(r.tokens / r.seconds / r.limit_tokens_per_s)


def test_bench_limits_cli_and_limit_line(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", kind="gemma3")
    model, _, _ = load_model(EngineConfig(model=folder))
    assert model_flops(model) == ModelFlops(GEMMA_BODY, HEAD)
    out = tmp_path / "l.json"
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", "limits",
                                 "--kv-memory", "0.05", "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["flops_per_token"] == {"prefill": GEMMA_BODY, "decode": GEMMA_BODY + HEAD}
    assert data["phases"]["prefill"]["tokens"] == 16 * 512
    assert data["phases"]["decode"]["tokens"] == 128 * 47
    assert "prefill: " in r.stdout and "of the matmul limit" in r.stdout
    r = CliRunner().invoke(app, ["bench", "--model", folder, "--workload", "random",
                                 "--num-prompts", "3", "--input-len", "10", "--output-len", "3",
                                 "--baselines", "mlxpa,mlx-lm", "--kv-memory", "0.01"])
    assert r.exit_code == 0, r.output
    assert "fraction of the matmul limit: mlxpa " in r.output and ", mlx-lm " in r.output
