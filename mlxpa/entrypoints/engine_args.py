"""``LLM(model, **kwargs)``: the keywords are :class:`EngineConfig`'s fields, vLLM's argument
names where vLLM has the option (``max_num_seqs``, ``kv_cache_memory_bytes``,
``disable_cascade_attn``, ...) and mlxpa's own where it has none (``adapter_path``,
``keep_quantized``, ``kv_group_size``). An unknown keyword is a ``TypeError`` naming it (with
the closest name, or what to use instead of a vLLM option mlxpa does not have): none is
dropped silently. No mlx.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from mlxpa.config import EngineConfig
from mlxpa.messages import FieldError, quote_value

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
    """The :class:`EngineConfig` of ``LLM(model, **options)``: ``EngineConfig(model=model,
    **options)``.

    Raises:
        TypeError: An unknown keyword (naming it, with a hint), or a ``model`` that is not a
            string.
        ValueError: A value out of range, naming the keyword (``max_num_seqs must be an
            integer >= 1, got 0``).
    """
    fields = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]
    for name in options:
        if name in fields:
            continue
        if name in VLLM_ONLY:
            raise TypeError(f"LLM() does not take vLLM's {name!r}: {VLLM_ONLY[name]}")
        close = difflib.get_close_matches(name, [*fields, "model"], 1, 0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"LLM() got an unexpected keyword argument {name!r}{hint}")
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a path, a Hugging Face repo id or None, got "
                        f"{type(model).__name__}")
    try:
        return EngineConfig(model=model, **options)
    except FieldError as e:
        raise ValueError(f"{e.field} must be {e.wanted}, got "
                         f"{quote_value(options.get(e.field))}") from None
