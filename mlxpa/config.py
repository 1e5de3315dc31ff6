"""Engine configuration: :class:`EngineConfig`, one flat frozen dataclass under vLLM's argument
names (``LLM(model, **kwargs)`` is ``EngineConfig(model=model, **kwargs)``), validated with
real errors (each check raises :class:`~mlxpa.messages.FieldError` naming the field); the
engine's lists of choices; the KV pool's memory budget in bytes (:func:`kv_budget_bytes`, read
by the loader and the model runner).

Sampling parameters are :mod:`mlxpa.sampling_params`; how messages quote values is
:mod:`mlxpa.messages`. No mlx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from mlxpa.messages import FieldError, check_field
from mlxpa.utils import is_finite, is_int

# Paged-attention backends (vLLM's ``attention_backend``; ``mlxpa.kernels`` picks one for
# ``auto``).
KERNELS = ("auto", "reference", "cpu", "metal", "cuda")
# Compute dtypes (vLLM's ``dtype``): ``auto`` is float32 on the CPU, the stored dtype elsewhere.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Bits per (key, value) element of each quantized KV cache dtype: mlx-lm's affine group
# quantization (``mx.quantize``) at 8 bits, 4 bits, or 8-bit keys with 4-bit values.
KV_BITS = {"int8": (8, 8), "int4": (4, 4), "k8v4": (8, 4)}
# KV cache storage (vLLM's ``kv_cache_dtype``): ``auto`` is the model's compute dtype.
KV_CACHE_DTYPES = ("auto", *KV_BITS)
# Group sizes ``mx.quantize`` supports (elements along head_dim sharing a scale and bias).
KV_GROUP_SIZES = (32, 64, 128)
# The KV pool's budget when ``kv_cache_memory_bytes`` is None: this share of physical memory,
# at most ``DEFAULT_KV_MAX_BYTES``.
DEFAULT_KV_FRACTION = 0.15
DEFAULT_KV_MAX_BYTES = 4 * 2**30
# A growing KV pool's segment when ``kv_segment_bytes`` is None: the memory it starts with and
# keeps when idle, and the step it grows by (docs/serve.md says why).
DEFAULT_KV_SEGMENT_BYTES = 64 * 2**20
# Seconds without work before a growing KV pool gives its segments back but one.
DEFAULT_KV_RELEASE_AFTER = 30.0
# Draft-free speculative decoding methods (vLLM's ``speculative_config["method"]``).
SPECULATIVE_METHODS = ("ngram", "suffix")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Draft-free speculative decoding, under vLLM's ``speculative_config`` names.

    Attributes:
        method: ``ngram`` (prompt lookup: the last ``prompt_lookup_min..max`` tokens matched
            earlier in the prompt and output, what followed proposed) or ``suffix`` (suffix
            decoding, Arctic Inference: a tree over the request and a bounded tree of earlier
            finished outputs).
        num_speculative_tokens: Most draft tokens per row and step (k); each step may use
            fewer (the live batch, the row's recent acceptance).
        prompt_lookup_min, prompt_lookup_max: n-gram lengths tried, longest first (``ngram``;
            one given: both; none: 2 and 4, measured better here than vLLM's 5 and 5).
        suffix_decoding_max_tree_depth: Longest pattern and draft the trees hold (``suffix``).
        suffix_decoding_max_cached_requests: Finished outputs kept in the shared tree (0: no
            shared tree).
        suffix_decoding_max_spec_factor: Draft at most this many tokens per matched token.
        suffix_decoding_min_token_prob: Stop a draft where the continuation's estimated
            probability falls below this.
        disable_by_batch_size: No drafts while more requests than this are running (None:
            only the measured cost rule gates).
    """

    method: str
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        f = "speculative_config."
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low, high = 2, 4
        object.__setattr__(self, "prompt_lookup_min", high if low is None else low)
        object.__setattr__(self, "prompt_lookup_max", low if high is None else high)
        check_field(self.method in SPECULATIVE_METHODS, f + "method", self.method,
                    f"one of {', '.join(SPECULATIVE_METHODS)} (draft-free methods; no draft "
                    "model is supported)")
        for name, low in (("num_speculative_tokens", 1), ("prompt_lookup_min", 1),
                          ("prompt_lookup_max", 1), ("suffix_decoding_max_tree_depth", 1),
                          ("suffix_decoding_max_cached_requests", 0)):
            value = getattr(self, name)
            check_field(is_int(value) and value >= low, f + name, value, f"an integer >= {low}")
        check_field(self.prompt_lookup_max >= self.prompt_lookup_min, f + "prompt_lookup_max",
                    self.prompt_lookup_max, f">= prompt_lookup_min ({self.prompt_lookup_min})")
        for name, low, high in (("suffix_decoding_max_spec_factor", 0.0, None),
                                ("suffix_decoding_min_token_prob", 0.0, 1.0)):
            value = getattr(self, name)
            check_field(is_finite(value) and value >= low and (high is None or value <= high),
                        f + name, value, f"a number >= {low}" + (f" and <= {high}" if high
                                                                 else ""))
        size = self.disable_by_batch_size
        check_field(size is None or (is_int(size) and size >= 1), f + "disable_by_batch_size",
                    size, "an integer >= 1 or None")

    @classmethod
    def of(cls, value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
        """From ``LLM(speculative_config=...)``'s dict, ``--speculative-config``'s JSON text,
        a config, or None.

        Raises:
            FieldError: Not JSON or not an object, an unknown key, or a field's check.
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise FieldError("speculative_config", "a JSON object", value) from None
        if not isinstance(value, dict) or "method" not in value:
            raise FieldError("speculative_config", 'an object with a "method"', value)
        names = {f.name for f in fields(cls)}
        for key in value:
            check_field(key in names, f"speculative_config.{key}", value[key],
                        f"absent: the fields are {', '.join(sorted(names))}")
        return cls(**value)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine configuration (one flat object; the CLI and ``LLM`` build it, everything below
    reads it). The names are vLLM's ``EngineArgs`` where vLLM has the option.

    Attributes:
        model: MLX folder, Hugging Face repo id (the cache first, else downloaded), ``.gguf``
            file, or None for the default Gemma 3 270M.
        revision: Branch, tag or commit of a Hugging Face repo id ``model`` (None: main).
        adapter_path: mlx-lm LoRA/DoRA adapter folder (``adapters.safetensors`` +
            ``adapter_config.json``) applied at load, or None (mlxpa's).
        keep_quantized: On MLX's CPU back end, keep quantized weights packed instead of
            dequantizing them at load (:mod:`mlxpa.loader.dequantize`; mlxpa's).
        dtype: Compute dtype: ``auto`` (float32 on the CPU, the stored dtype on a GPU),
            ``float32``, ``bfloat16`` or ``float16`` (None is read as ``auto``).
        seed: Engine seed for requests that give none.
        block_size: Tokens per KV block.
        num_blocks: KV blocks including the null block 0, fixed (vLLM's
            ``num_gpu_blocks_override``); None sizes the pool from the memory budget and
            what the work can use (:func:`mlxpa.core.kv_sizing.num_kv_blocks`).
        kv_cache_memory_bytes: KV pool budget in bytes (all layers, K and V); None takes 15%
            of the machine's memory, at most 4 GiB (:func:`kv_budget_bytes`).
        kv_cache_dtype: KV pool storage: ``auto`` (the compute dtype), ``int8``, ``int4`` or
            ``k8v4`` (8-bit keys, 4-bit values): mlx-lm's affine group quantization along
            head_dim, per token (:mod:`mlxpa.worker.kv_storage`; None is read as ``auto``).
        kv_group_size: Elements of head_dim sharing one scale and bias when quantized (32,
            64 or 128; mlxpa's).
        kv_segment_bytes: Where the work is not known up front (a server, ``LLM``), the KV
            pool starts at one segment of this many bytes and grows by segments as requests
            need blocks, up to the budget; 0: it takes the whole budget at start; None:
            :data:`DEFAULT_KV_SEGMENT_BYTES` (mlxpa's).
        kv_release_after: Seconds without work after which a growing KV pool gives back its
            segments but one (the cached blocks that fit in it kept); negative: never
            (mlxpa's; ollama's ``keep_alive`` for a model).
        max_num_seqs: Most requests running at once (decode batch size). On the CPU the LM
            head and weight reads dominate a decode step, so a bigger batch is nearly free.
        max_num_batched_tokens: Token budget of one step (prefill chunks + decodes).
        max_model_len: Longest prompt + completion in tokens; None takes the model's context.
        enable_prefix_caching: Reuse cached full blocks across requests (radix tree).
        kv_cache_dir: A folder for the disk KV tier under the prefix cache (``auto``:
            ``$XDG_CACHE_HOME/mlxpa/kv``), or None: off. Blocks that prefix hits read are
            written there when they leave memory and at the end of a run, and later runs,
            restarted servers and other processes read them back instead of computing them
            (:mod:`mlxpa.core.kv_disk`); mlxpa's.
        kv_cache_disk_gb: Most GiB of files the ``kv_cache_dir`` folder keeps (least
            recently used removed first); mlxpa's.
        disable_cascade_attn: Turn cascade attention off. When on, decode rows that share
            leading KV blocks attend over the shared prefix once per group and over their
            own suffix apart, merged by their log-sum-exp, where the model runner's cost rule
            finds it pays (:mod:`mlxpa.worker.cascade`).
        attention_backend: Paged-attention kernels: ``auto``, ``reference``, ``cpu``,
            ``metal`` or ``cuda``.
        fused_cpu_ops: On MLX's CPU back end, run the model's tanh-GELU / SiLU and RoPE
            through mlxpa's fused kernels (:mod:`mlxpa.kernels.cpu_fused`); mlxpa's.
        speculative_config: Draft-free speculative decoding (:class:`SpeculativeConfig`, or
            its dict or JSON text), or None: off.
    """

    model: str | None = None
    revision: str | None = None
    adapter_path: str | None = None
    keep_quantized: bool = False
    dtype: str = "auto"
    seed: int = 0
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    kv_group_size: int = 64
    kv_segment_bytes: int | None = None
    kv_release_after: float = DEFAULT_KV_RELEASE_AFTER
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dir: str | None = None
    kv_cache_disk_gb: float = 10.0
    disable_cascade_attn: bool = False
    attention_backend: str = "auto"
    fused_cpu_ops: bool = True
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        for name in ("dtype", "kv_cache_dtype"):  # vLLM's "auto", also spelled None
            if getattr(self, name) is None:
                object.__setattr__(self, name, "auto")
        memory = self.kv_cache_memory_bytes
        check_field(memory is None or (is_finite(memory) and memory > 0),
                    "kv_cache_memory_bytes", memory, "a number of bytes > 0")
        if memory is not None:
            object.__setattr__(self, "kv_cache_memory_bytes", max(1, int(memory)))
        object.__setattr__(self, "speculative_config",
                           SpeculativeConfig.of(self.speculative_config))
        self._check_model()
        self._check_cache()
        self._check_scheduler()

    def _check_model(self) -> None:
        """The model, its load and its compute."""
        for name, what in (("revision", "a non-empty string"), ("adapter_path", "a folder path")):
            value = getattr(self, name)
            check_field(value is None or (isinstance(value, str) and value), name, value,
                        f"{what} or None")
        self._check_choice("dtype", DTYPES)
        self._check_choice("attention_backend", KERNELS)
        for name in ("keep_quantized", "fused_cpu_ops"):
            self._check_bool(name)

    def _check_cache(self) -> None:
        """The KV pool."""
        check_field(is_int(self.block_size) and 1 <= self.block_size <= 256
                    and self.block_size & (self.block_size - 1) == 0,
                    "block_size", self.block_size, "a power of two from 1 to 256")
        check_field(self.num_blocks is None or (is_int(self.num_blocks)
                                                and self.num_blocks >= 2),
                    "num_blocks", self.num_blocks, "an integer >= 2 or None")
        self._check_choice("kv_cache_dtype", KV_CACHE_DTYPES)
        check_field(type(self.kv_group_size) is int and self.kv_group_size in KV_GROUP_SIZES,
                    "kv_group_size", self.kv_group_size,
                    f"one of {', '.join(map(str, KV_GROUP_SIZES))}")
        self._check_bool("enable_prefix_caching")
        check_field(self.kv_cache_dir is None or (isinstance(self.kv_cache_dir, str)
                                                  and self.kv_cache_dir),
                    "kv_cache_dir", self.kv_cache_dir, "a folder path, auto, or None")
        check_field(is_finite(self.kv_cache_disk_gb) and not isinstance(
            self.kv_cache_disk_gb, bool) and self.kv_cache_disk_gb > 0, "kv_cache_disk_gb",
            self.kv_cache_disk_gb, "a number of GiB > 0")
        check_field(self.kv_segment_bytes is None or (is_int(self.kv_segment_bytes)
                                                       and self.kv_segment_bytes >= 0),
                    "kv_segment_bytes", self.kv_segment_bytes, "an integer >= 0 or None")
        after = self.kv_release_after
        check_field(not isinstance(after, bool) and isinstance(after, (int, float))
                    and after == after, "kv_release_after", after,
                    "a number of seconds (negative: never)")

    def _check_scheduler(self) -> None:
        """Batching, lengths, cascade attention and the seed."""
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            check_field(is_int(value) and value >= 1, name, value, "an integer >= 1")
        check_field(self.max_model_len is None or (is_int(self.max_model_len)
                                                   and self.max_model_len >= 2),
                    "max_model_len", self.max_model_len,
                    "an integer >= 2 (a prompt token and an output token) or None")
        check_field(is_int(self.seed) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        self._check_bool("disable_cascade_attn")

    def _check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, name)
        check_field(value in choices, name, value, f"one of {', '.join(choices)}")

    def _check_bool(self, name: str) -> None:
        check_field(isinstance(getattr(self, name), bool), name, getattr(self, name),
                    "true or false")


def default_kv_bytes() -> int:
    """KV pool budget when none is given: :data:`DEFAULT_KV_FRACTION` of physical memory (8 GiB
    assumed when unknown), at most :data:`DEFAULT_KV_MAX_BYTES`."""
    from mlxpa.blas import host_memory_bytes

    total = host_memory_bytes() or 8 * 2**30
    return int(min(DEFAULT_KV_MAX_BYTES, DEFAULT_KV_FRACTION * total))


def kv_budget_bytes(config: EngineConfig) -> int:
    """The KV pool's memory budget in bytes: ``config.kv_cache_memory_bytes``, else
    :func:`default_kv_bytes` (the loader leaves room for it when it dequantizes; the model
    runner sizes the pool from it)."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    return default_kv_bytes()
