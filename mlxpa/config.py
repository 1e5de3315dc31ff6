"""Engine configuration: :class:`EngineConfig`, one flat frozen dataclass validated with real
errors (each check raises :class:`~mlxpa.messages.FieldError` naming the field), and the
engine's lists of choices (attention kernels, KV cache dtypes, KV group sizes).

Sampling parameters are :mod:`mlxpa.sampling_params`; how messages quote values is
:mod:`mlxpa.messages`. No mlx.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxpa.messages import check_field as _check
from mlxpa.utils import is_finite as _finite
from mlxpa.utils import is_int as _int

# Paged-attention backends (``mlxpa.kernels`` picks one for ``auto``).
KERNELS = ("auto", "reference", "cpu", "metal", "cuda")
# Bits per (key, value) element of each quantized KV cache dtype: mlx-lm's affine group
# quantization (``mx.quantize``) at 8 bits, 4 bits, or 8-bit keys with 4-bit values.
KV_BITS = {"int8": (8, 8), "int4": (4, 4), "k8v4": (8, 4)}
# KV cache storage (vLLM's ``--kv-cache-dtype`` name): ``auto`` is the model's compute dtype.
KV_CACHE_DTYPES = ("auto", *KV_BITS)
# Group sizes ``mx.quantize`` supports (elements along head_dim sharing a scale and bias).
KV_GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine configuration (one flat object; the CLI builds it, everything below reads it).

    Attributes:
        model: ``--model`` spec (MLX folder, Hugging Face repo id: the cache first, else
            downloaded; ``.gguf`` file) or None for the default Gemma 3 270M.
        block_size: Tokens per KV block.
        num_blocks: KV blocks per layer including the null block 0; None sizes the pool from
            ``kv_memory_gib``.
        kv_memory_gib: KV pool budget in GiB (all layers, K and V) when ``num_blocks`` is None;
            None takes 15% of the machine's memory, at most 4 GiB.
        kv_blocks_needed: Most blocks the work can use, null block included (from
            :func:`mlxpa.core.kv_sizing.kv_blocks_needed`); the pool takes the smaller of this
            and the budget. None: the whole budget.
        max_num_seqs: Most requests running at once (decode batch size). On the CPU the LM
            head and weight reads dominate a decode step, so a bigger batch is nearly free:
            a step at 128 rows costs about what one at 64 does (measured with Gemma 3 270M).
        max_num_batched_tokens: Token budget of one step (prefill chunks + decodes).
        max_model_len: Longest prompt + completion in tokens; None takes the model's context.
        enable_prefix_caching: Reuse cached full blocks across requests (radix tree).
        kernel: Paged-attention backend: ``auto``, ``reference``, ``cpu``, ``metal`` or
            ``cuda``.
        dtype: Compute dtype name (``float32``, ``bfloat16``, ``float16``); None picks float32
            on the CPU and bfloat16 on a GPU.
        seed: Engine seed for requests that give none.
        fused_cpu_ops: On MLX's CPU back end, run the model's tanh-GELU / SiLU and RoPE
            through mlxpa's fused kernels (``mlxpa.kernels.cpu_fused``) during the forward
            pass; no effect on Metal or CUDA.
        revision: Branch, tag or commit of a Hugging Face repo id ``model`` (None: main).
        adapter_path: mlx-lm LoRA/DoRA adapter folder (``adapters.safetensors`` +
            ``adapter_config.json``) applied at load, or None.
        keep_quantized: On MLX's CPU back end, keep quantized weights packed instead of
            dequantizing them at load (:mod:`mlxpa.loader.dequantize`).
        kv_cache_dtype: KV pool storage: ``auto`` (the compute dtype), ``int8``, ``int4`` or
            ``k8v4`` (8-bit keys, 4-bit values): mlx-lm's affine group quantization along
            head_dim, per token (:mod:`mlxpa.worker.kv_storage`).
        kv_group_size: Elements of head_dim sharing one scale and bias when quantized (32,
            64 or 128).
        enable_cascade_attention: Decode rows that share leading KV blocks attend over the
            shared prefix once per group and over their own suffix apart, the two merged by
            their log-sum-exp (cascade attention, vLLM's name), where the model runner's
            cost rule finds it pays (``mlxpa.worker.cascade``).
    """

    model: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    kv_memory_gib: float | None = None
    kv_blocks_needed: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    kernel: str = "auto"
    dtype: str | None = None
    seed: int = 0
    fused_cpu_ops: bool = True
    revision: str | None = None
    adapter_path: str | None = None
    keep_quantized: bool = False
    kv_cache_dtype: str = "auto"
    kv_group_size: int = 64
    enable_cascade_attention: bool = True

    def __post_init__(self) -> None:
        _check(_int(self.block_size) and 1 <= self.block_size <= 256
               and self.block_size & (self.block_size - 1) == 0,
               "block_size", self.block_size, "a power of two from 1 to 256")
        _check(self.num_blocks is None or (_int(self.num_blocks) and self.num_blocks >= 2),
               "num_blocks", self.num_blocks, "an integer >= 2 or None")
        _check(self.kv_memory_gib is None or (_finite(self.kv_memory_gib)
                                              and self.kv_memory_gib > 0), "kv_memory_gib",
               self.kv_memory_gib, "> 0")
        _check(self.kv_blocks_needed is None or (_int(self.kv_blocks_needed)
                                                 and self.kv_blocks_needed >= 2),
               "kv_blocks_needed",
               self.kv_blocks_needed, "an integer >= 2 or None")
        _check(_int(self.max_num_seqs) and self.max_num_seqs >= 1,
               "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        _check(_int(self.max_num_batched_tokens) and self.max_num_batched_tokens >= 1,
               "max_num_batched_tokens", self.max_num_batched_tokens, "an integer >= 1")
        _check(self.max_model_len is None or (_int(self.max_model_len)
                                              and self.max_model_len >= 2),
               "max_model_len", self.max_model_len,
               "an integer >= 2 (a prompt token and an output token) or None")
        _check(isinstance(self.enable_prefix_caching, bool), "enable_prefix_caching",
               self.enable_prefix_caching, "true or false")
        _check(self.kernel in KERNELS, "kernel", self.kernel, f"one of {', '.join(KERNELS)}")
        _check(self.dtype in (None, "float32", "bfloat16", "float16"), "dtype", self.dtype,
               "one of float32, bfloat16, float16")
        _check(_int(self.seed) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        _check(self.revision is None or (isinstance(self.revision, str) and self.revision),
               "revision", self.revision, "a non-empty string or None")
        _check(self.adapter_path is None or (isinstance(self.adapter_path, str)
                                             and self.adapter_path),
               "adapter_path", self.adapter_path, "a folder path or None")
        _check(isinstance(self.keep_quantized, bool), "keep_quantized", self.keep_quantized,
               "true or false")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", self.kv_cache_dtype,
               f"one of {', '.join(KV_CACHE_DTYPES)}")
        _check(type(self.kv_group_size) is int and self.kv_group_size in KV_GROUP_SIZES,
               "kv_group_size", self.kv_group_size,
               f"one of {', '.join(map(str, KV_GROUP_SIZES))}")
        _check(isinstance(self.enable_cascade_attention, bool), "enable_cascade_attention",
               self.enable_cascade_attention, "true or false")
