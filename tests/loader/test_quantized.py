"""Quantized models token-identical to mlx-lm on the same weights.

Each case quantizes a tiny random model in the test with mlx-lm's own ``quantize_model``
(what ``mlx_lm convert -q`` runs), then compares the engine's greedy ids with mlx-lm's
``generate_step`` on the very same model object. Before the compute-dtype fix the KV pools
took their dtype from the (packed ``uint32``) embedding weight and every quantized model
gave garbage.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.convert import mixed_quant_predicate_builder
from mlx_lm.generate import generate_step
from mlx_lm.utils import quantize_model

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.model_runner import ModelRunner
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

PROMPTS = ["hello world, this is a test", "a", "The quick brown fox jumps over the lazy dog."]
MAX_TOKENS = 10


def greedy_pair(model) -> tuple[list[list[int]], list[list[int]]]:
    """(mlx-lm's greedy ids, the engine's greedy ids) for every prompt."""
    tok = byte_tokenizer(eos_id=-1)
    ids = [tok.encode(p) for p in PROMPTS]
    refs = [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=MAX_TOKENS)]
            for p in ids]
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=64), model, tok)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = {int(o.request_id): o.token_ids for o in eng.generate(
        EngineRequest(str(i), p, params) for i, p in enumerate(ids))}
    return refs, [outs[i] for i in range(len(ids))]


def quantized(model, **kwargs):
    quantize_model(model, {}, **kwargs)
    mx.eval(model.parameters())
    return model


AFFINE = [(bits, group) for bits in (2, 3, 4, 5, 6, 8) for group in (32, 64, 128)]


@pytest.mark.parametrize("bits,group", AFFINE, ids=[f"affine{b}-g{g}" for b, g in AFFINE])
def test_affine_modes(bits, group):
    model = quantized(tiny_llama(hidden=128, tie=bits % 2 == 0), group_size=group, bits=bits)
    assert model.model.embed_tokens.weight.dtype == mx.uint32  # the embedding is packed too
    refs, got = greedy_pair(model)
    assert got == refs
    assert len({t for r in refs for t in r}) > 3  # a non-degenerate reference


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_fp_modes(mode):
    refs, got = greedy_pair(quantized(tiny_llama(hidden=128, tie=True), group_size=None,
                                      bits=None, mode=mode))
    assert got == refs


@pytest.mark.parametrize("recipe", ["mixed_2_6", "mixed_3_4", "mixed_4_6"])
def test_mixed_precision_recipes(recipe):
    model = tiny_llama(hidden=128)
    predicate = mixed_quant_predicate_builder(recipe, model, group_size=64)
    refs, got = greedy_pair(quantized(model, group_size=64, bits=4, quant_predicate=predicate))
    assert got == refs
    bits = {m.bits for _, m in model.named_modules() if hasattr(m, "bits")}
    assert len(bits) == 2  # two precisions, as the recipe says


def test_gemma3_quantized_tied_head_uses_split():
    """Gemma 3 (the default model's architecture): quantized tied embedding as LM head; the
    head still runs only on sampled rows (the split passed the load check)."""
    model = quantized(tiny_gemma3(), group_size=32, bits=4)
    refs, got = greedy_pair(model)
    assert got == refs
    runner = ModelRunner(model, EngineConfig(block_size=8, num_blocks=8))
    assert runner.dtype == mx.float32
    assert runner._split is not None


@pytest.mark.slow  # a GGUF conversion
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_compute_dtype_from_the_model(dtype):
    """The pools take the dtype the model computes in, never a packed weight's."""
    model = quantized(tiny_llama(hidden=128), group_size=64, bits=4)
    model.set_dtype(dtype)
    runner = ModelRunner(model, EngineConfig(block_size=8, num_blocks=8))
    runner.allocate_kv_cache(runner.budget_blocks)
    assert runner.dtype == dtype
    assert runner.kv_cache.key_caches[0].dtype == dtype
