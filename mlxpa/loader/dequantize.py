"""Quantized weights dequantized while loading on MLX's CPU back end, where a packed matmul runs
about ten times slower than OpenBLAS's float32 one (``benchmarks/quant_bench.py``); Metal and
CUDA keep their fast quantized path, and ``--keep-quantized`` keeps the weights packed.
mlx-lm's own ``dequantize_model`` swaps one layer at a time, largest first (a large embedding
in slices), so the packed and float copies never live together: the peak is the float model
plus one packed layer, and the float model plus the KV budget must fit in 80% of the memory
available. Outputs equal mlx-lm's on its own dequantized model.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

logger = logging.getLogger(__name__)

MEMORY_FRACTION = 0.8  # of the available memory the float weights and KV budget may take
SLICE_BYTES = 64 * 2**20  # a larger weight is dequantized in slices of about this size


class QuantizedSize(NamedTuple):
    """Bytes of a model's weights, packed as loaded and with every quantized layer float."""

    packed: int  # all parameters as loaded
    dequantized: int  # the same model after dequantization
    added: int  # float bytes of the dequantized layers (what the swap allocates)


def quantized_size(model: nn.Module, dtype: mx.Dtype) -> QuantizedSize | None:
    """The weights' bytes before and after dequantizing to ``dtype``; None when no layer is
    one mlx-lm's ``dequantize_model`` swaps (``QuantizedLinear``, ``QuantizedEmbedding``,
    ``QuantizedSwitchLinear``)."""
    from mlx.utils import tree_flatten

    total = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    packed = added = 0
    for _, module in _quantized_layers(model):
        w = module.weight
        packed += sum(v.nbytes for _, v in tree_flatten(module.parameters()))
        logical = w.size // w.shape[-1] * (w.shape[-1] * 32 // module.bits)
        added += logical * dtype.size + (module["bias"].nbytes if "bias" in module else 0)
    if not packed:
        return None
    return QuantizedSize(total, total - packed + added, added)


def dequantize_for_cpu(model: nn.Module, name: str, dtype: mx.Dtype, kv_bytes: int,
                       keep_quantized: bool) -> bool:
    """Dequantize ``model`` in place where the module docstring's rules say so, one layer at a
    time; one log line either way (``name`` names the model in it).

    Args:
        model: An mlx-lm model, best lazily loaded (``mlx_lm.utils.load_model(lazy=True)``: the
            packed layers are then read one at a time here), adapters applied, floating
            parameters cast to ``dtype``. Parameters other than the swapped layers' stay as
            they were (lazy ones are left for the caller to evaluate).
        name: The model as the user gave it (``--model``), for the log line.
        dtype: The compute dtype the float weights take.
        kv_bytes: The KV pool's budget in bytes, which the float weights must leave room for.
        keep_quantized: Keep the packed weights (``--keep-quantized``).

    Returns:
        True when the model was dequantized.
    """
    import mlx.core as mx

    from mlxpa.blas import available_memory_bytes, host_memory_bytes
    from mlxpa.kernels.device import on_cpu

    size = quantized_size(model, dtype) if on_cpu() else None
    if size is None:
        return False
    if keep_quantized:
        logger.info("Keeping %s quantized (--keep-quantized): quantized matmuls are slower "
                    "than float ones on MLX's CPU back end", name)
        return False
    available = available_memory_bytes()
    if available is None:  # no /proc/meminfo (macOS): the memory MLX does not hold yet
        total = host_memory_bytes()
        available = None if total is None else max(0, total - mx.get_active_memory())
    need = size.dequantized + kv_bytes
    if available is None or need > MEMORY_FRACTION * available:
        logger.warning(
            "Keeping %s quantized: its %s weights (%s) and the KV budget (%s) need more than "
            "%d%% of the available memory (%s); quantized matmuls are slower on the CPU",
            name, _dtype_name(dtype), _gib(size.dequantized), _gib(kv_bytes),
            MEMORY_FRACTION * 100, "unknown" if available is None else _gib(available))
        return False
    _swap_layers(model, dtype)
    logger.info("Dequantized %s for MLX's CPU back end: weights %s packed -> %s %s "
                "(--keep-quantized keeps them packed)", name, _gib(size.packed),
                _gib(size.dequantized), _dtype_name(dtype))
    return True


def _swap_layers(model: nn.Module, dtype: mx.Dtype) -> None:
    """Replace each quantized layer by its float twin, largest first, evaluating it and freeing
    the packed one before the next. mlx-lm's ``dequantize_model``, applied to that layer alone,
    builds the twin (its class and bias); the weight is computed by :func:`_float_weight`."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import dequantize_model

    layers = _quantized_layers(model)
    layers.sort(key=lambda item: sum(v.nbytes for _, v in tree_flatten(item[1].parameters())))
    while layers:
        path, packed = layers.pop()
        holder = nn.Module()
        holder.layer = packed
        dequantize_model(holder)
        layer = holder.pop("layer")
        layer.weight = _float_weight(packed, dtype)  # replaces the whole-layer graph unread
        del packed
        layer.set_dtype(dtype)  # the bias
        mx.eval(layer.parameters())
        model.update_modules(tree_unflatten([(path, layer)]))  # the last packed reference
        del layer
        mx.clear_cache()  # the packed buffers go back to the system, not to MLX's cache


def _float_weight(packed: nn.Module, dtype: mx.Dtype) -> mx.array:
    """``mx.dequantize`` of a packed layer's weight (as ``dequantize_model`` calls it), cast to
    ``dtype``. MLX's CPU kernel allocates a scratch array as large as its output, so a weight
    over :data:`SLICE_BYTES` is dequantized in slices of its first axis, each written into one
    preallocated array; slices of whole groups give the same values bit for bit.

    Returns:
        ``[..., in_features]`` in ``dtype``; evaluated when sliced, lazy otherwise.
    """
    import mlx.core as mx

    w, scales, biases = packed.weight, packed.scales, packed.biases
    shape = (*w.shape[:-1], w.shape[-1] * 32 // packed.bits)

    def part(a: int, b: int) -> mx.array:
        return mx.dequantize(w[a:b], scales[a:b], None if biases is None else biases[a:b],
                             packed.group_size, packed.bits, packed.mode).astype(dtype)

    row_bytes = max(dtype.size, 4) * (math.prod(shape) // shape[0])
    step = max(1, SLICE_BYTES // row_bytes)
    if step >= shape[0]:
        return part(0, shape[0])
    out = mx.zeros(shape, dtype)
    for a in range(0, shape[0], step):
        out[a:a + step] = part(a, a + step)  # written in place: ``out`` has no other reader
        mx.eval(out)
    return out


def _quantized_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    return [(n, m) for n, m in model.named_modules() if isinstance(m, kinds)]


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"
