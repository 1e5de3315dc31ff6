"""Engine and sampling configuration: flat frozen dataclasses validated with real errors.

Every check raises ``ValueError`` naming the offending field, so the CLI can map it to a
clear message. The rules are stated once, here: a row's sampling fields are checked by
building a :class:`SamplingParams` from them (:class:`FieldError` says what the field
wants), and :func:`token_id_problem` is the one wording of a token id outside the vocabulary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mlxpa.structured.spec import StructuredOutput, StructuredOutputsParams

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
# Most alternatives per token of ``logprobs`` (vLLM's default ``max_logprobs``, OpenAI's limit).
MAX_LOGPROBS = 20
_MAX_SHOWN = 60  # characters of an offending value quoted in a message
# Ranges of the OpenAI / vLLM penalty fields (OpenAI's API documents both).
MAX_PENALTY = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2]
MAX_LOGIT_BIAS = 100.0  # a logit_bias value lies in [-100, 100]


class FieldError(ValueError):
    """One configuration field outside its range: ``"<field> must be <wanted>, got <value>"``.

    Attributes:
        field: The field's name.
        wanted: What the field must be (``"an integer >= 0"``), the words row messages use.
    """

    def __init__(self, field: str, wanted: str, value: object) -> None:
        super().__init__(f"{field} must be {wanted}, got {value!r}")
        self.field = field
        self.wanted = wanted


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float's range
        return False


def _check(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise FieldError(name, want, value)


def show(value: Any) -> str:
    """``value`` as JSON, cut to a readable length (how messages quote a user's value)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = _cut(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _cut(value: Any) -> str:
    """A short description of a value ``json.dumps`` cannot write (a huge int, deep nesting)."""
    if isinstance(value, int):
        return f"an integer of {value.bit_length()} bits"
    return f"a nested {type(value).__name__}" if isinstance(value, (list, dict)) else "a value"


def bad(field: str, wanted: str, value: Any) -> str:
    """``field "x" must be <wanted>, got <value>`` (a row's field)."""
    return f'field "{field}" must be {wanted}, got {show(value)}'


def token_id_problem(field: str, ids: Iterable[object], vocab_size: int) -> str | None:
    """The problem with the first of ``ids`` that does not index the model's vocabulary (an
    int in ``[0, vocab_size)``), or None when every id does.

    Returns:
        ``field "<field>": token id <id> is outside the model's vocabulary (<V> ids,
        0..<V - 1>)``, or None.
    """
    bad_id = next((t for t in ids if not (_int(t) and 0 <= t < vocab_size)), None)
    if bad_id is None:
        return None
    return (f'field "{field}": token id {show(bad_id)} is outside the model\'s vocabulary '
            f"({vocab_size} ids, 0..{vocab_size - 1})")


def sampling_field_problem(name: str, value: object) -> str | None:
    """What :class:`SamplingParams` wants of field ``name`` when ``value`` breaks its rule
    (the ``wanted`` of :class:`FieldError`), else None. Rules between two fields
    (``min_tokens <= max_tokens``) are not checked: they hold once a row's fields are merged
    with the run's defaults."""
    try:
        SamplingParams(**{name: value})
    except FieldError as e:
        return e.wanted
    except ValueError:  # a rule between fields
        pass
    return None


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM's ``SamplingParams``: its names and
    shapes; the defaults are mlxpa's, greedy and 256 tokens, where vLLM's are temperature 1.0
    and 16 tokens).

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
            ``token_ids``, its text is not in ``text``); one id or a list of them.
        include_stop_str_in_output: Keep the matched stop string at the end of ``text``.
        min_tokens: Tokens to generate before EOS, stop token ids or stop strings may end
            the completion (EOS and stop token ids are masked out until then, as in vLLM).
        structured_outputs: Constraint on the completion: vLLM's
            :class:`~mlxpa.structured.spec.StructuredOutputsParams` (JSON schema, regex,
            choice, grammar), kept as its canonical
            :class:`~mlxpa.structured.spec.StructuredOutput`; None for free text.
        logprobs: None: no log-probabilities; ``k``: each generated token's log-probability
            and its ``k`` most likely alternatives (0 to :data:`MAX_LOGPROBS`), as vLLM's.
        repetition_penalty: vLLM's (CTRL's, Keskar et al. 2019) multiplicative penalty, > 0
            (1: off): every token that occurs in the prompt or the output so far has its
            logit divided by it when positive, multiplied by it when not.
        presence_penalty: OpenAI's additive penalty in [-2, 2] (0: off), subtracted once
            from the logit of every token that occurs in the output so far (not the prompt).
        frequency_penalty: OpenAI's additive penalty in [-2, 2] (0: off), subtracted from a
            token's logit once per occurrence in the output so far (not the prompt).
        logit_bias: OpenAI's token id -> bias in [-100, 100], added to the token's logit
            before the penalties (None or empty: off). Ids must index the model's
            vocabulary (checked by the engine and the row check).
        prompt_logprobs: vLLM's: None (off), or return the log-probability of every prompt
            token after the first given the tokens before it, with this many most likely
            alternatives per position (0 to 20); needs ``max_tokens >= 1`` and no ``choice``
            constraint (a choice row is scored, not decoded).

    The order of the logit processing is vLLM v1's sampler's (``vllm/v1/sample/sampler.py``):
    raw log-probabilities (``logprobs``) are taken first, then the grammar mask,
    ``min_tokens``, ``logit_bias``, the repetition, frequency and presence penalties, then
    temperature, top-k, top-p and min-p (greedy requests take the argmax of the penalised
    logits). ``mlxpa.worker.penalties`` applies them.
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
    structured_outputs: StructuredOutput | StructuredOutputsParams | None = None
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.top_k == -1:  # vLLM's and the rows' "disabled"
            object.__setattr__(self, "top_k", 0)
        if isinstance(self.stop_token_ids, list) or _int(self.stop_token_ids):
            ids = self.stop_token_ids
            object.__setattr__(self, "stop_token_ids", tuple(ids) if isinstance(ids, list)
                               else (ids,))
        if isinstance(self.structured_outputs, StructuredOutputsParams):
            object.__setattr__(self, "structured_outputs",
                               self.structured_outputs.to_structured_output())
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        _check(_int(self.max_tokens) and self.max_tokens >= 0,
               "max_tokens", self.max_tokens, "an integer >= 0")
        _check(_finite(self.temperature) and self.temperature >= 0,
               "temperature", self.temperature, "a finite number >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1,
               "top_p", self.top_p, "a number in (0, 1]")
        _check(_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k,
               "an integer >= 0 (or -1: off)")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1,
               "min_p", self.min_p, "a number in [0, 1]")
        _check(self.seed is None or (_int(self.seed) and self.seed >= 0),
               "seed", self.seed, "an integer >= 0")
        _check(isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop),
               "stop", self.stop, "a non-empty string or a list of them")
        _check(_int(self.n) and 1 <= self.n <= MAX_N, "n", self.n,
               f"an integer from 1 to {MAX_N}")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "true or false")
        _check(isinstance(self.stop_token_ids, tuple)
               and all(_int(t) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", self.stop_token_ids,
               "a token id (an integer >= 0) or a list of them")
        _check(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output",
               self.include_stop_str_in_output, "true or false")
        _check(_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens",
               self.min_tokens, "an integer >= 0")
        _check(self.structured_outputs is None
               or isinstance(self.structured_outputs, StructuredOutput),
               "structured_outputs", self.structured_outputs,
               "a StructuredOutputsParams or None")
        _check(self.logprobs is None or (_int(self.logprobs)
                                         and 0 <= self.logprobs <= MAX_LOGPROBS),
               "logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        _check(_finite(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty", self.repetition_penalty, "a finite number > 0 (1: off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -MAX_PENALTY <= value <= MAX_PENALTY, name, value,
                   f"a number from -{MAX_PENALTY:g} to {MAX_PENALTY:g} (0: off)")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        _check(self.prompt_logprobs is None or (
            _int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
            "prompt_logprobs", self.prompt_logprobs,
            f"an integer from 0 to {MAX_LOGPROBS} or null")
        if self.min_tokens > self.max_tokens:  # a rule between fields: a plain ValueError
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), as in "
                             f"vLLM, got {self.min_tokens!r}")
        if self.prompt_logprobs is not None and self.structured_outputs is not None and (
                self.structured_outputs.kind == "choice"):
            raise ValueError("prompt_logprobs is not available on a choice row (it is scored, "
                             "not decoded: choice_logprobs gives each label's "
                             "log-probability)")
        if self.prompt_logprobs is not None and self.max_tokens == 0:
            raise ValueError("max_tokens must be >= 1 with prompt_logprobs (the prompt is "
                             "scored in the step that samples the first token, as in vLLM), "
                             "got 0")

    @property
    def greedy(self) -> bool:
        """True when sampling is an argmax (temperature below :data:`SAMPLING_EPS`)."""
        return self.temperature < SAMPLING_EPS

    @property
    def penalised(self) -> bool:
        """True when ``logit_bias`` or a penalty changes the logits."""
        return bool(self.logit_bias) or self.repetition_penalty != 1 or bool(
            self.presence_penalty) or bool(self.frequency_penalty)


_LOGIT_BIAS_WANTED = (f"an object of token id (an integer >= 0) -> bias from "
                      f"-{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}")


def _logit_bias(value: object) -> dict[int, float] | None:
    """``logit_bias`` as a new ``{int: float}`` dict (None when empty).

    Raises:
        FieldError: Not a mapping of integer ids >= 0 to finite biases in [-100, 100].
    """
    if value is None:
        return None
    ok = isinstance(value, Mapping) and all(
        _int(k) and k >= 0 and _finite(b) and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
        for k, b in value.items())
    _check(ok, "logit_bias", value, _LOGIT_BIAS_WANTED)
    return {k: float(b) for k, b in value.items()} or None


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
