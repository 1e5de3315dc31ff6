"""Two CPU streams for MLX's CPU back end, and an MLP that runs its two row halves on them.

MLX runs each CPU stream on its own thread, and its CPU element-wise ops (the fused GELU of
:mod:`mlxpa.kernels.cpu_fused`, the attention softmax) use one thread: on a 2-core machine
the second core idles while they run. Independent work put on two streams runs on both
cores. Splitting one op's input and concatenating the halves costs a copy of the result, so
the split is made where the concatenated result is small: the attention tiles of short
prefill chunks and of cascade attention's shared prefixes
(:mod:`mlxpa.kernels.cpu_paged_attention`; long chunks run theirs on numpy threads,
:mod:`mlxpa.kernels.cpu_prefill_attention`) and the MLP block, whose
``[tokens, hidden]`` output is a third of its ``[tokens, intermediate]`` activations in
Gemma 3 270M. Rows of an MLP are independent, so running two row halves gives the same
values.
"""

from __future__ import annotations

import threading

import mlx.core as mx
import mlx.nn as nn

# MLX streams belong to the thread that made them ("There is no Stream(cpu, 1) in current
# thread" elsewhere): one pair per thread (a Ray actor runs calls on another thread than the
# one that built it).
_LOCAL = threading.local()
# An MLP input with fewer rows (tokens) than this runs whole on the current stream.
MIN_SPLIT_ROWS = 256


def cpu_streams() -> list[mx.Stream]:
    """The default CPU stream and a second one (created once per thread)."""
    streams = getattr(_LOCAL, "streams", None)
    if streams is None:
        streams = _LOCAL.streams = [mx.default_stream(mx.cpu), mx.new_stream(mx.cpu)]
    return streams


def is_dense_mlp(module: nn.Module) -> bool:
    """Whether ``module``'s only children are ``Linear`` layers (a dense MLP block: its rows are
    independent; mixture-of-experts blocks, with a router and expert stacks, are not matched)."""
    children = [c for c in module.children().values() if not (isinstance(c, (list, dict))
                                                                 and not c)]
    return bool(children) and all(isinstance(c, (nn.Linear, nn.QuantizedLinear))
                                  for c in children)


class RowSplitMLP(nn.Module):
    """Runs a token-wise module (an mlx-lm MLP block) on the two halves of its ``[..., hidden]``
    input's rows, one half per CPU stream, and concatenates the outputs.

    Args:
        mlp: The module it wraps; called unchanged on each half.
        min_rows: Inputs with fewer rows run whole (default: :data:`MIN_SPLIT_ROWS` when
            called).
    """

    def __init__(self, mlp: nn.Module, min_rows: int | None = None) -> None:
        super().__init__()
        self._mlp = mlp
        self._min_rows = min_rows

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        rows = x.size // x.shape[-1] if x.ndim >= 2 else 0
        if args or kwargs or rows < (self._min_rows or MIN_SPLIT_ROWS):
            return self._mlp(x, *args, **kwargs)
        flat, half = x.reshape(rows, x.shape[-1]), rows // 2
        outs = []
        for stream, part in zip(cpu_streams(), (flat[:half], flat[half:])):
            with mx.stream(stream):
                outs.append(self._mlp(part))
        out = mx.concatenate(outs, axis=0)
        return out.reshape(*x.shape[:-1], out.shape[-1])
