"""Quantized KV pools (``--kv-cache-dtype``) through the whole engine against mlx-lm's
quantized KV cache: greedy token ids identical on tiny llama and gemma3_text (sliding windows
of 8 tokens) models, with block boundaries, chunked prefill, preemption, prefix cache hits and
forked samples.

Oracles, all mlx-lm's ``generate_step``:

- ``int8`` / ``int4``: mlx-lm's own ``QuantizedKVCache`` (``mx.quantize``, groups of 64) for
  every layer from the first token, passed as ``prompt_cache`` with ``kv_bits``,
  ``kv_group_size=64``, ``quantized_kv_start=0``. (Without ``prompt_cache``, mlx-lm prefills
  all but the last prompt token into a float cache and quantizes it afterwards, so those
  tokens attend in full precision; and it cannot quantize a ``RotatingKVCache`` at all, the
  sliding-window layers of Gemma 3. The engine quantizes every token when it is written, as
  ``QuantizedKVCache`` does, so that a row's output does not depend on how its prompt was
  chunked or whether its prefix was cached.) Its sliding-window layers take the window from
  the mask mlx-lm builds for them (``make_mask(..., window_size=8)``), as a ``KVCache`` does.
- ``k8v4``: mlx-lm's cache has one bit width, so the oracle is mlx-lm's ``KVCache`` storing
  each new key row as ``mx.dequantize(mx.quantize(k, 64, 8))`` and each value row at 4 bits,
  attended by mlx-lm's own SDPA; the same construction at 8/8 bits gives exactly
  ``QuantizedKVCache``'s tokens (checked below).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams
from tests.engine.test_llm_engine import PROMPTS, tiny_pool
from tests.tiny_models import byte_tokenizer, tiny_gemma3, tiny_llama

MAX_TOKENS = 12
BITS = {"int8": (8, 8), "int4": (4, 4), "k8v4": (8, 4)}


class RoundTripKVCache(KVCache):
    """mlx-lm's ``KVCache`` holding each new row quantized and dequantized (groups of 64):
    keys at ``k_bits``, values at ``v_bits``."""

    def __init__(self, k_bits: int, v_bits: int) -> None:
        super().__init__()
        self.k_bits, self.v_bits = k_bits, v_bits

    def update_and_fetch(self, keys, values):
        def rt(x, bits):
            return mx.dequantize(*mx.quantize(x, group_size=64, bits=bits), group_size=64,
                                 bits=bits)
        return super().update_and_fetch(rt(keys, self.k_bits), rt(values, self.v_bits))


def mlx_lm_quantized(model, ids: list[int], kv_cache_dtype: str, n: int = MAX_TOKENS):
    """Greedy ids of mlx-lm's quantized-KV generation (see the module docstring)."""
    k_bits, v_bits = BITS[kv_cache_dtype]
    layers = len(make_prompt_cache(model))
    if k_bits == v_bits:
        cache = [QuantizedKVCache(group_size=64, bits=k_bits) for _ in range(layers)]
        steps = generate_step(mx.array(ids), model, max_tokens=n, prompt_cache=cache,
                              kv_bits=k_bits, kv_group_size=64, quantized_kv_start=0)
    else:
        cache = [RoundTripKVCache(k_bits, v_bits) for _ in range(layers)]
        steps = generate_step(mx.array(ids), model, max_tokens=n, prompt_cache=cache)
    return [int(t) for t, _ in steps]


def _model(name: str):
    return (tiny_llama(hidden=256) if name == "llama"
            else tiny_gemma3(head_dim=64, sliding_window=8))


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model(request):
    return _model(request.param)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(eos_id=-1)


_REFS: dict = {}


def refs_for(model, tok, kv_cache_dtype: str, prompts=PROMPTS) -> list[list[int]]:
    key = (model.args.model_type, kv_cache_dtype, tuple(prompts))  # one model per type
    if key not in _REFS:
        _REFS[key] = [mlx_lm_quantized(model, tok.encode(p), kv_cache_dtype) for p in prompts]
    return _REFS[key]


def run(model, tok, config: EngineConfig, prompts=PROMPTS, n: int = 1):
    eng = LLMEngine(config, model, tok)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=n)
    outs: dict = {}
    for o in eng.generate(EngineRequest(str(i), tok.encode(p), params)
                          for i, p in enumerate(prompts)):
        outs.setdefault(int(o.request_id), []).append(o.token_ids)
    eng.kv_cache_manager.check_invariants([])
    return eng, outs


@pytest.mark.parametrize("kv_cache_dtype", list(BITS))
@pytest.mark.parametrize("config", [
    dict(block_size=16, num_blocks=64),                                # whole prompts
    dict(block_size=8, num_blocks=64, max_num_batched_tokens=7),       # chunks across blocks
    dict(block_size=8, num_blocks=20, max_num_batched_tokens=32),      # preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_mlx_lm_quantized_cache(model, tok, kv_cache_dtype, config):
    """Prompts of 1, 12, 15 (block - 1), 16 (one block of 16, two of 8), 27 and 135 tokens
    (past the 8-token window of the gemma model's local layers)."""
    refs = refs_for(model, tok, kv_cache_dtype)
    if config["num_blocks"] == 20:
        config = {**config, "num_blocks": tiny_pool(model, 20, 30)}
    eng, outs = run(model, tok, EngineConfig(**config, kv_cache_dtype=kv_cache_dtype))
    assert eng.runner.kv_storage.kv_cache_dtype == kv_cache_dtype
    assert all(s.k_bits == BITS[kv_cache_dtype][0] for s in eng.runner.kv_storage.specs)
    for i, ref in enumerate(refs):
        assert outs[i] == [ref], f"prompt {i}"
    if config.get("max_num_batched_tokens") == 32:
        assert eng.counters.num_preemptions > 0


def test_quantization_changes_the_oracle(model, tok):
    """The comparison has teeth: at 4 bits mlx-lm's greedy ids differ from its float ones."""
    float_ids = [[int(t) for t, _ in generate_step(mx.array(tok.encode(p)), model,
                                                    max_tokens=MAX_TOKENS)] for p in PROMPTS]
    assert refs_for(model, tok, "int4") != float_ids


def test_round_trip_oracle_is_mlx_lm_quantized_cache_at_equal_bits(model, tok):
    """The k8v4 oracle's construction at 8/8 bits gives ``QuantizedKVCache``'s ids."""
    layers = len(make_prompt_cache(model))
    for p in PROMPTS[2:4]:
        ids = tok.encode(p)
        steps = generate_step(mx.array(ids), model, max_tokens=MAX_TOKENS,
                              prompt_cache=[RoundTripKVCache(8, 8) for _ in range(layers)])
        assert [int(t) for t, _ in steps] == mlx_lm_quantized(model, ids, "int8")


SHARED = ["The quick brown fox jumps over the lazy dog. " * 2 + tail
          for tail in ("Who?", "What did the fox do?", "Why", "")]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "k8v4"])
def test_prefix_hits_read_the_cached_quantized_blocks(model, tok, kv_cache_dtype):
    """Rows sharing a 90-token prefix: later rows hit the first row's full quantized blocks
    (never re-quantized) and still give mlx-lm's ids."""
    refs = refs_for(model, tok, kv_cache_dtype, SHARED)
    eng, outs = run(model, tok, EngineConfig(block_size=8, num_blocks=128, max_num_seqs=1,
                                             kv_cache_dtype=kv_cache_dtype), SHARED)
    assert eng.counters.cached_prompt_tokens >= 3 * 88
    assert [outs[i] for i in range(len(SHARED))] == [[r] for r in refs]


def test_forked_samples_copy_the_quantized_partial_block(model, tok, monkeypatch):
    """``n = 3`` greedy samples: the prompt's partial block is shared after the fork and
    copied (packed words, scales and biases) before each sample's first write; every sample
    gives mlx-lm's ids."""
    from mlxpa.worker.kv_cache import PagedKVCache

    copied = []
    real = PagedKVCache.copy_blocks
    monkeypatch.setattr(PagedKVCache, "copy_blocks",
                        lambda self, pairs: copied.extend(pairs) or real(self, pairs))
    prompts = PROMPTS[:1] + PROMPTS[3:4]
    refs = refs_for(model, tok, "int4", prompts)
    eng, outs = run(model, tok, EngineConfig(block_size=8, num_blocks=64, kv_cache_dtype="int4"),
                    prompts, n=3)
    assert [outs[i] for i in range(len(prompts))] == [[r] * 3 for r in refs]
    assert len(copied) >= 2  # at least one copy per prompt's forked partial block


def test_literal_mlx_lm_kv_bits_call_on_llama(tok):
    """mlx-lm's documented quantized-KV call without ``prompt_cache`` (its first prefill
    chunk attends in float) gives the same int8 ids on the llama model's prompts."""
    model = _model("llama")
    _, outs = run(model, tok, EngineConfig(block_size=8, num_blocks=64, kv_cache_dtype="int8"))
    for i, p in enumerate(PROMPTS):
        steps = generate_step(mx.array(tok.encode(p)), model, max_tokens=MAX_TOKENS, kv_bits=8,
                              kv_group_size=64, quantized_kv_start=0)
        assert outs[i] == [[int(t) for t, _ in steps]], f"prompt {i}"


def test_hybrid_model_quantizes_its_attention_and_keeps_its_state(tok):
    """qwen3_next (gated-delta layers with a recurrent state, full-attention layers with
    K/V heads of 32): the attention pools are int8 (groups of 32), the state entries have no
    pool and keep float32, and the ids equal mlx-lm's with ``QuantizedKVCache`` in the
    attention layers."""
    from tests.loader.tiny_archs import build

    model = build("qwen3_next", head_dim=32)
    caches = make_prompt_cache(model)
    eng, outs = run(model, tok, EngineConfig(block_size=8, num_blocks=64, kv_cache_dtype="int8",
                                             kv_group_size=32), PROMPTS[:4])
    storage = eng.runner.kv_storage
    assert [s.k_bits for s in storage.specs] == [8 if isinstance(c, KVCache) else 0
                                                 for c in caches]
    assert storage.num_states == sum(not isinstance(c, KVCache) for c in caches) > 0
    assert "recurrent state in float32" in storage.describe()
    for i, p in enumerate(PROMPTS[:4]):
        cache = [QuantizedKVCache(group_size=32, bits=8) if isinstance(c, KVCache) else c
                 for c in make_prompt_cache(model)]
        steps = generate_step(mx.array(tok.encode(p)), model, max_tokens=MAX_TOKENS,
                              prompt_cache=cache)
        assert outs[i] == [[int(t) for t, _ in steps]], f"prompt {i}"


def test_latent_attention_keeps_its_dtype_and_says_why(tok):
    """deepseek_v3 (MLA: its layers compute K/V from the cached latent, ``gathered``): the
    entries keep float32 with the reason on the KV pool line, and the ids equal the float
    run's."""
    from tests.loader.tiny_archs import build

    model = build("deepseek_v3")
    _, auto = run(model, tok, EngineConfig(block_size=8, num_blocks=64), PROMPTS[:3])
    eng, outs = run(model, tok, EngineConfig(block_size=8, num_blocks=64, kv_cache_dtype="int8",
                                             kv_group_size=32), PROMPTS[:3])
    storage = eng.runner.kv_storage
    assert all(s.k_bits == 0 for s in storage.specs) and len(storage.kept) == len(storage.specs)
    assert "latent attention, MLA" in storage.describe()
    assert storage.describe().startswith("float32 (int8 applies to no cache)")
    assert outs == auto
