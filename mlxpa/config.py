"""Engine and sampling configuration: flat frozen dataclasses validated with real errors.

Every check raises ``ValueError`` naming the offending field, so the CLI can map it to a
clear message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlxpa.structured_spec import StructuredOutput

# Paged-attention backends (``mlxpa.kernels`` picks one for ``auto``).
KERNELS = ("auto", "reference", "cpu", "metal", "cuda")
# KV cache storage (vLLM's ``--kv-cache-dtype`` name): the model's compute dtype, or mlx-lm's
# affine group quantization (``mx.quantize``) at 8 bits, 4 bits, or 8-bit keys with 4-bit values.
KV_CACHE_DTYPES = ("auto", "int8", "int4", "k8v4")
# Group sizes ``mx.quantize`` supports (elements along head_dim sharing a scale and bias).
KV_GROUP_SIZES = (32, 64, 128)
# Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): ``1 / temperature`` would
# overflow float32 and turn the logits into infinities.
SAMPLING_EPS = 1e-5
# Most samples of one prompt: each is a request, so a row with n = 10**9 would stall the run
# (and hold its memory) instead of failing.
MAX_N = 1024


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {want}, got {value!r}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (the vLLM / OpenAI names).

    Attributes:
        max_tokens: Most tokens to generate (0 gives an empty completion, finish reason
            ``length``).
        temperature: 0 (or anything below :data:`SAMPLING_EPS`, as in vLLM) means greedy
            (argmax); above, samples from ``softmax(logits / temperature)``.
        top_p: Nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens; 0 disables it (-1, vLLM's "off", is
            stored as 0).
        min_p: Drop tokens whose probability is below ``min_p * p_max``; 0 disables it.
        seed: Per-request seed; the same seed gives the same text whatever else is batched.
        stop: Stop strings; the completion ends before the earliest match (not included).
        n: Number of samples of the prompt (1 to :data:`MAX_N`).
        ignore_eos: Keep generating past the model's EOS ids (benchmarks).
        stop_token_ids: Token ids that end the completion like EOS (the token is kept in
            ``token_ids``, its text is not in ``text``).
        include_stop_str_in_output: Keep the matched stop string at the end of ``text``.
        min_tokens: Tokens to generate before EOS, stop token ids or stop strings may end
            the completion (EOS and stop token ids are masked out until then, as in vLLM).
        structured: Constraint on the completion (JSON schema, regex, choice, grammar), or
            None for free text.
        logprobs: Return the log-probability of every generated token.
        top_logprobs: Also return this many most likely tokens per position (0 to 20).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    structured: StructuredOutput | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.top_k == -1:  # vLLM's and the rows' "disabled"
            object.__setattr__(self, "top_k", 0)
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 0,
               "max_tokens", self.max_tokens, "an integer >= 0")
        _check(_finite(self.temperature) and self.temperature >= 0,
               "temperature", self.temperature, "a finite number >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1,
               "top_p", self.top_p, "a number in (0, 1]")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k,
               "an integer >= 0 (or -1: off)")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1,
               "min_p", self.min_p, "a number in [0, 1]")
        _check(self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
               "seed", self.seed, "an integer >= 0 or null")
        _check(isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop),
               "stop", self.stop, "a list of non-empty strings")
        _check(isinstance(self.n, int) and 1 <= self.n <= MAX_N, "n", self.n,
               f"an integer from 1 to {MAX_N}")
        _check(isinstance(self.stop_token_ids, tuple)
               and all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", self.stop_token_ids, "a list of token ids")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               self.min_tokens, "an integer >= 0")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               self.min_tokens, f"<= max_tokens ({self.max_tokens}), as in vLLM")
        _check(self.structured is None or isinstance(self.structured, StructuredOutput),
               "structured", self.structured, "a StructuredOutput or None")
        _check(isinstance(self.logprobs, bool), "logprobs", self.logprobs, "true or false")
        _check(isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= 20,
               "top_logprobs", self.top_logprobs, "an integer from 0 to 20")

    @property
    def greedy(self) -> bool:
        """True when sampling is an argmax (temperature below :data:`SAMPLING_EPS`)."""
        return self.temperature < SAMPLING_EPS


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine configuration (one flat object; the CLI builds it, everything below reads it).

    Attributes:
        model: ``--model`` spec (MLX folder, local Hugging Face repo id, ``.gguf`` file) or
            None for the default Gemma 3 270M.
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
        kv_cache_dtype: KV pool storage: ``auto`` (the compute dtype), ``int8``, ``int4`` or
            ``k8v4`` (8-bit keys, 4-bit values): mlx-lm's affine group quantization along
            head_dim, per token (:mod:`mlxpa.worker.kv_storage`).
        kv_group_size: Elements of head_dim sharing one scale and bias when quantized (32,
            64 or 128).
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
    kv_cache_dtype: str = "auto"
    kv_group_size: int = 64

    def __post_init__(self) -> None:
        _check(isinstance(self.block_size, int) and 1 <= self.block_size <= 256
               and self.block_size & (self.block_size - 1) == 0,
               "block_size", self.block_size, "a power of two from 1 to 256")
        _check(self.num_blocks is None or (isinstance(self.num_blocks, int)
                                           and self.num_blocks >= 2),
               "num_blocks", self.num_blocks, "an integer >= 2 or None")
        _check(self.kv_memory_gib is None or self.kv_memory_gib > 0, "kv_memory_gib",
               self.kv_memory_gib, "> 0")
        _check(self.kv_blocks_needed is None or self.kv_blocks_needed >= 2, "kv_blocks_needed",
               self.kv_blocks_needed, "an integer >= 2 or None")
        _check(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
               "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        _check(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= 1,
               "max_num_batched_tokens", self.max_num_batched_tokens, "an integer >= 1")
        _check(self.max_model_len is None or self.max_model_len >= 2,
               "max_model_len", self.max_model_len,
               "an integer >= 2 (a prompt token and an output token) or None")
        _check(self.kernel in KERNELS, "kernel", self.kernel, f"one of {', '.join(KERNELS)}")
        _check(self.dtype in (None, "float32", "bfloat16", "float16"), "dtype", self.dtype,
               "one of float32, bfloat16, float16")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", self.kv_cache_dtype,
               f"one of {', '.join(KV_CACHE_DTYPES)}")
        _check(type(self.kv_group_size) is int and self.kv_group_size in KV_GROUP_SIZES,
               "kv_group_size", self.kv_group_size,
               f"one of {', '.join(map(str, KV_GROUP_SIZES))}")
