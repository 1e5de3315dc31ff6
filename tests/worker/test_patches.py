"""``worker.patches``: every swap inside mlx-lm's model modules holds only while its context is
open, is undone after an exception too, and leaves the model's output unchanged outside."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import base, gemma3_text, llama

from mlxpa.kernels import cpu_fused
from mlxpa.worker.patches import fused_cpu_ops, model_modules, paged_attention
from tests.tiny_models import tiny_gemma3, tiny_llama


def test_model_modules_are_the_defining_modules():
    names = [m.__name__ for m in model_modules(tiny_llama())]
    assert "mlx_lm.models.llama" in names and names == sorted(names)


@pytest.mark.parametrize("make", [tiny_gemma3, tiny_llama])
def test_patch_swaps_inside_context_only(make):
    model = make()
    module = gemma3_text if make is tiny_gemma3 else llama
    x = mx.array([[5, 9, 33, 71, 2, 8]])
    want = model(x)
    ropes = [m.self_attn.rope for m in model.layers]
    with fused_cpu_ops(model):
        assert module.nn is not nn
        if module is llama:
            assert module.swiglu is cpu_fused.swiglu
        assert all(isinstance(m.self_attn.rope, cpu_fused.TableRoPE) for m in model.layers)
        # Offsets as an array (what the paged cache passes) take the table path.
        got = model(x)
    assert module.nn is nn
    assert module is gemma3_text or module.swiglu is not cpu_fused.swiglu
    assert [m.self_attn.rope for m in model.layers] == ropes
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-4, rtol=1e-4)
    assert mx.array_equal(model(x), want)


@pytest.mark.parametrize(("make", "module"), [(tiny_gemma3, gemma3_text), (tiny_llama, llama)])
def test_paged_attention_swaps_the_dispatcher_inside_context_only(make, module):
    model = make()
    original = module.scaled_dot_product_attention
    with paged_attention(model):
        patched = module.scaled_dot_product_attention
        assert patched.mlxpa_original is original
        with paged_attention(model):  # entered again: no second wrapper
            assert module.scaled_dot_product_attention is patched
        assert module.scaled_dot_product_attention is patched
    assert module.scaled_dot_product_attention is original
    assert base.scaled_dot_product_attention is not patched


def test_swaps_are_undone_after_an_exception():
    model = tiny_llama()
    original = llama.scaled_dot_product_attention
    with pytest.raises(RuntimeError), paged_attention(model), fused_cpu_ops(model):
        assert llama.nn is not nn
        raise RuntimeError("boom")
    assert llama.scaled_dot_product_attention is original and llama.nn is nn
    assert all(type(m.self_attn.rope) is nn.RoPE for m in model.layers)


def test_a_model_without_the_attention_name_is_refused():
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

    with pytest.raises(ValueError, match="does not use mlx-lm's scaled_dot_product_attention"):
        with paged_attention(Plain()):
            pass
