"""Quantized models dequantized at load on MLX's CPU back end: token-identical to mlx-lm on
mlx-lm's own dequantized model, close to the packed model's logits, kept packed with
``--keep-quantized`` or when memory does not allow, and sized by hand."""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.utils import dequantize_model, quantize_model

from mlxpa.config import EngineConfig
from mlxpa.loader import dequantize
from mlxpa.loader.models import load_model
from tests.loader.folders import engine_for, engine_greedy, mlx_lm_greedy, tiny_folders
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU back end only")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_folders(tmp_path_factory.mktemp("dequantize"))


def _kinds(model) -> set[str]:
    return {type(m).__name__ for _, m in model.named_modules()}


def test_engine_matches_mlx_lm_on_its_dequantized_model(folders, caplog):
    model, tok = load(folders["q4"])
    dequantize_model(model)
    want = mlx_lm_greedy(model, tok)
    with caplog.at_level(logging.INFO, logger="mlxpa.loader.dequantize"):
        engine = engine_for(folders["q4"])
    assert engine_greedy(engine) == want
    assert not {"QuantizedLinear", "QuantizedEmbedding"} & _kinds(engine.runner.model)
    line = next(r.getMessage() for r in caplog.records if "Dequantized" in r.getMessage())
    assert line.startswith(f"Dequantized {folders['q4']} for MLX's CPU back end: weights ")
    assert "float32 (--keep-quantized keeps them packed)" in line


def test_keep_quantized_keeps_the_packed_layers(folders):
    model, tok = load(folders["q4"])
    engine = engine_for(folders["q4"], keep_quantized=True)
    assert {"QuantizedLinear", "QuantizedEmbedding"} <= _kinds(engine.runner.model)
    assert engine_greedy(engine) == mlx_lm_greedy(model, tok)


def test_dequantized_logits_close_to_the_packed_ones(folders):
    """An oracle independent of ``dequantize_model``: the packed model's own forward."""
    packed, _, _ = load_model(EngineConfig(model=folders["q4"], keep_quantized=True))
    floats, _, _ = load_model(EngineConfig(model=folders["q4"], kv_cache_memory_bytes=1))  # no KV
    x = mx.array([[5, 17, 40, 99, 3, 250]])
    np.testing.assert_allclose(np.array(floats(x)), np.array(packed(x)), rtol=1e-4, atol=1e-4)


def test_float_model_is_left_alone(folders, caplog):
    with caplog.at_level(logging.INFO, logger="mlxpa.loader.dequantize"):
        load_model(EngineConfig(model=folders["float"]))
    assert not caplog.records


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_fp_modes_end_in_the_compute_dtype(mode):
    """fp4/fp8 layers dequantize to bfloat16; the swap casts them to float32, and the
    logits stay those of the packed model computing in float32."""
    model = tiny_llama(hidden=128)
    quantize_model(model, {}, group_size=None, bits=None, mode=mode)
    model.set_dtype(mx.float32)
    x = mx.array([[5, 17, 40, 99]])
    want = np.array(model(x))
    assert dequantize.dequantize_for_cpu(model, "tiny", mx.float32, 0, False)
    assert {v.dtype for _, v in nn.utils.tree_flatten(model.parameters())} == {mx.float32}
    np.testing.assert_allclose(np.array(model(x)), want, rtol=1e-4, atol=1e-4)


def test_sizes_by_hand():
    """A 64 -> 32 affine 4-bit layer (group 64) with a bias: packed = weight 32 x 8 uint32
    + scales 32 x 1 + biases 32 x 1 + bias 32 (float32), float = 32 x 64 float32 + bias."""
    layer = nn.QuantizedLinear.from_linear(nn.Linear(64, 32), group_size=64, bits=4)
    model = nn.Sequential(layer)
    packed = (32 * 8 + 32 + 32 + 32) * 4
    size = dequantize.quantized_size(model, mx.float32)
    assert size == dequantize.QuantizedSize(packed, (32 * 64 + 32) * 4, (32 * 64 + 32) * 4)
    assert dequantize.quantized_size(nn.Sequential(nn.Linear(4, 4)), mx.float32) is None


def test_memory_rule_keeps_it_packed(folders, monkeypatch, caplog):
    """The float model + KV budget over 80% of the memory available before the weights are
    read: packed, said once."""
    packed, _, _ = load_model(EngineConfig(model=folders["q4"], keep_quantized=True))
    size = dequantize.quantized_size(packed, mx.float32)
    monkeypatch.setattr("mlxpa.blas.available_memory_bytes", lambda: 10 * 2**30)
    limit = int(dequantize.MEMORY_FRACTION * 10 * 2**30)
    kv = limit - size.dequantized + 1  # one byte over the rule
    with caplog.at_level(logging.INFO, logger="mlxpa.loader.dequantize"):
        model, _, _ = load_model(EngineConfig(model=folders["q4"], kv_cache_memory_bytes=kv))
    assert "QuantizedLinear" in _kinds(model)
    assert "need more than 80% of the available memory (10.00 GiB)" in caplog.text
    at_rule = EngineConfig(model=folders["q4"], kv_cache_memory_bytes=kv - 1)
    model, _, _ = load_model(at_rule)  # exactly at the rule
    assert "QuantizedLinear" not in _kinds(model)


def test_without_meminfo_the_rule_uses_physical_memory(folders, monkeypatch):
    """macOS has no /proc/meminfo: physical memory less what MLX holds stands in."""
    monkeypatch.setattr("mlxpa.blas.available_memory_bytes", lambda: None)
    monkeypatch.setattr("mlxpa.blas.host_memory_bytes", lambda: 2**16)  # 64 KiB: too small
    model, _, _ = load_model(EngineConfig(model=folders["q4"]))
    assert "QuantizedLinear" in _kinds(model)
    monkeypatch.setattr("mlxpa.blas.host_memory_bytes", lambda: 2**40)
    model, _, _ = load_model(EngineConfig(model=folders["q4"]))
    assert "QuantizedLinear" not in _kinds(model)


def test_packed_and_float_copies_never_live_together(folders):
    """MLX's peak memory while loading the 4-bit model stays within the float model plus its
    largest packed layer (the layers are read and swapped one at a time); holding both copies
    whole would need the packed model on top of the float one."""
    import gc

    from mlx.utils import tree_flatten

    packed, _, _ = load_model(EngineConfig(model=folders["q4"], keep_quantized=True))
    size = dequantize.quantized_size(packed, mx.float32)
    largest = max(sum(v.nbytes for _, v in tree_flatten(m.parameters()))
                  for _, m in dequantize._quantized_layers(packed))
    assert largest < size.packed / 4  # so the bound below is far from packed + float
    del packed
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    model, _, _ = load_model(EngineConfig(model=folders["q4"]))
    assert "QuantizedLinear" not in _kinds(model)
    assert mx.get_peak_memory() - before <= size.dequantized + largest


@pytest.mark.parametrize("mode", ["affine", "mxfp8"])
def test_sliced_weight_is_mx_dequantize_bit_for_bit(monkeypatch, mode):
    """A weight over ``SLICE_BYTES`` is dequantized in slices of rows written into one array:
    the values are ``mx.dequantize``'s whole-array ones, and MLX's peak while computing it is
    the float weight plus about two slices (not ``mx.dequantize``'s output-sized scratch)."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    monkeypatch.setattr(dequantize, "SLICE_BYTES", 2**20)
    mx.random.seed(0)
    linear = nn.QuantizedLinear.from_linear(nn.Linear(512, 4096), group_size=32, bits=8,
                                            mode=mode)
    switch = QuantizedSwitchLinear(256, 512, 16, bias=False, group_size=64, bits=4)
    for layer in (linear, switch):
        mx.eval(layer.parameters())
        want = mx.dequantize(layer.weight, layer.scales, layer.get("biases"), layer.group_size,
                             layer.bits, layer.mode).astype(mx.float32)
        mx.eval(want)
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        got = dequantize._float_weight(layer, mx.float32)
        mx.eval(got)
        assert mx.get_peak_memory() - before <= want.nbytes + 2 * 2**20 + 4096
        assert got.dtype == mx.float32 and mx.array_equal(got, want).item()
