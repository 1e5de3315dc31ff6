"""``LLM(model, **engine options)``: the keywords, one table onto :class:`EngineConfig`.

The options are ``mlxpa run``'s, under vLLM's argument names where vLLM has the option
(``max_num_seqs``, ``kv_cache_memory_bytes``, ...) and mlxpa's own where it has none
(``adapter_path``, ``keep_quantized``, ``kernel``). A new :class:`EngineConfig` field is one
line of :data:`ENGINE_ARGS`. An unknown keyword is a ``TypeError`` naming it (with the
closest name, or what to use instead of a vLLM option mlxpa does not have): none is dropped
silently. No mlx.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from mlxpa.config import EngineConfig
from mlxpa.messages import FieldError, quote_value

# LLM keyword -> EngineConfig field.
ENGINE_ARGS: dict[str, str] = {
    "revision": "revision",
    "adapter_path": "adapter_path",
    "keep_quantized": "keep_quantized",
    "dtype": "dtype",
    "seed": "seed",
    "block_size": "block_size",
    "kv_cache_memory_bytes": "kv_memory_gib",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "kernel": "kernel",
    "kv_cache_dtype": "kv_cache_dtype",
    "kv_group_size": "kv_group_size",
    "disable_cascade_attn": "enable_cascade_attention",  # vLLM's name (negated)
    "enable_cascade_attention": "enable_cascade_attention",  # the field's (issue 23's) name
}


def _gib(num_bytes: Any) -> float | None:
    if num_bytes is None:
        return None
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)) or not (
            num_bytes > 0):
        raise FieldError("kv_cache_memory_bytes", "a number of bytes > 0", num_bytes)
    return num_bytes / 2**30


# How a keyword's value becomes its field's (the rest are taken as they are).
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "kv_cache_memory_bytes": _gib,
    "dtype": lambda d: None if d == "auto" else d,  # vLLM's "auto": the model's choice
    "kv_cache_dtype": lambda d: "auto" if d is None else d,
    # vLLM's switch is the negation of the field (a non-bool is left for the field's check).
    "disable_cascade_attn": lambda v: (not v) if isinstance(v, bool) else v,
}
# vLLM options mlxpa does not have, and what to do instead.
VLLM_ONLY: dict[str, str] = {
    "gpu_memory_utilization": "mlxpa sizes the KV pool in bytes: kv_cache_memory_bytes",
    "tensor_parallel_size": "mlxpa runs one model on one device (scale out with mlxpa.ray)",
    "quantization": "quantized MLX models load as they are (keep_quantized=True keeps them "
                    "packed on the CPU)",
    "trust_remote_code": "mlxpa runs mlx-lm's own model classes, never a repository's code",
    "tokenizer": "mlxpa loads the model folder's own tokenizer",
}


def engine_config(model: str | None, options: dict[str, Any]) -> EngineConfig:
    """The :class:`EngineConfig` of ``LLM(model, **options)``.

    Raises:
        TypeError: An unknown keyword (naming it, with a hint).
        ValueError: A value out of range, naming the keyword (``max_num_seqs must be an
            integer >= 1, got 0``).
    """
    for name in options:
        if name in ENGINE_ARGS:
            continue
        if name in VLLM_ONLY:
            raise TypeError(f"LLM() does not take vLLM's {name!r}: {VLLM_ONLY[name]}")
        close = difflib.get_close_matches(name, [*ENGINE_ARGS, "model"], 1, 0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"LLM() got an unexpected keyword argument {name!r}{hint}")
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a path, a Hugging Face repo id or None, got "
                        f"{type(model).__name__}")
    given = [k for k in options if ENGINE_ARGS[k] == "enable_cascade_attention"]
    if len(given) > 1:
        raise TypeError("LLM() takes one of disable_cascade_attn and enable_cascade_attention, "
                        "not both")
    try:
        fields = {ENGINE_ARGS[k]: _CONVERT.get(k, lambda v: v)(v) for k, v in options.items()}
        return EngineConfig(model=model, **fields)
    except FieldError as e:
        name = next((k for k in options if ENGINE_ARGS[k] == e.field), e.field)
        raise ValueError(f"{name} must be {e.wanted}, got "
                         f"{quote_value(options.get(name))}") from None
