"""The swaps inside mlx-lm's model modules for one forward pass, in one place.

mlx-lm models call module-level names bound in their own module (``scaled_dot_product_attention``
from ``.base``, ``nn``, ``swiglu``) and hold ``nn.RoPE`` children. For the length of the model
runner's forward pass, and only then (mlx-lm's own calls in the same process are untouched):

* :func:`paged_attention` swaps each module's ``scaled_dot_product_attention`` for a dispatcher
  that sends a :class:`~mlxpa.worker.attention.PagedLayerCache` to the paged kernels and any
  other cache to the original;
* :func:`fused_cpu_ops` (MLX's CPU back end) swaps ``nn`` and ``swiglu`` for the fused
  element-wise kernels of :mod:`mlxpa.kernels.cpu_fused`, and plain ``nn.RoPE`` children for
  :class:`~mlxpa.kernels.cpu_fused.TableRoPE`, and ``mlp`` children for
  :class:`~mlxpa.kernels.cpu_streams.RowSplitMLP` (dense MLPs: the two row halves on two CPU
  streams).

Both find the modules the same way (:func:`model_modules`) and undo their swaps in reverse
order on exit, also after an exception. When an mlx-lm release changes how models bind these
names, this is the file to change.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import mlx.nn as nn

from mlxpa.kernels import cpu_fused
from mlxpa.kernels.cpu_streams import RowSplitMLP, is_dense_mlp
from mlxpa.worker.attention import PagedLayerCache


def model_modules(model: nn.Module) -> list[types.ModuleType]:
    """The Python modules that define the model and its submodules (where their code looks up
    module-level names), sorted by name."""
    names = {type(model).__module__} | {type(m).__module__ for _, m in model.named_modules()}
    return [sys.modules[n] for n in sorted(names) if n in sys.modules]


class _Swaps:
    """Attribute and child swaps, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def attr(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, getattr(obj, name), False))
        setattr(obj, name, value)

    def child(self, parent: nn.Module, key: str, value: Any) -> None:
        self._undo.append((parent, key, parent[key], True))
        parent[key] = value

    def restore(self) -> None:
        for obj, name, original, is_child in reversed(self._undo):
            if is_child:
                with suppress(Exception):
                    obj[name] = original
            else:
                setattr(obj, name, original)
        self._undo.clear()


def _dispatch(original: Any) -> Any:
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None,
                                     **kwargs):
        if isinstance(cache, PagedLayerCache) and cache.gathered:
            return cache.attend_gathered(queries, keys, values, scale, mask, sinks)
        if isinstance(cache, PagedLayerCache):
            return cache.attend(queries, scale, sinks)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask,
                        sinks=sinks, **kwargs)

    scaled_dot_product_attention.mlxpa_original = original
    return scaled_dot_product_attention


@contextmanager
def paged_attention(model: nn.Module) -> Iterator[None]:
    """Swap ``scaled_dot_product_attention`` in the model's modules for the paged dispatcher
    while open (a name bound by ``from .base import`` is not affected by patching ``base``, so
    each defining module is patched); restore the originals on exit.

    Raises:
        ValueError: No module of the model binds ``scaled_dot_product_attention`` (an
            architecture whose attention cannot be paged this way), naming the model type.
    """
    modules = model_modules(model)
    swaps = _Swaps()
    already = False
    for module in modules:
        original = getattr(module, "scaled_dot_product_attention", None)
        if original is not None and hasattr(original, "mlxpa_original"):
            already = True
        elif original is not None:
            swaps.attr(module, "scaled_dot_product_attention", _dispatch(original))
    if not swaps._undo and not already:
        raise ValueError(
            f"model type {getattr(model, 'model_type', type(model).__name__)!r} does not use "
            "mlx-lm's scaled_dot_product_attention; paged attention cannot be applied to it")
    try:
        yield
    finally:
        swaps.restore()


@contextmanager
def fused_cpu_ops(model: nn.Module) -> Iterator[None]:
    """While open, the model's modules see the fused kernels for ``nn`` and ``swiglu``, and its
    plain ``nn.RoPE`` children are :class:`~mlxpa.kernels.cpu_fused.TableRoPE` (sharing one
    cos/sin table cache), and its dense ``mlp`` children run their row halves on two CPU streams
    (:class:`~mlxpa.kernels.cpu_streams.RowSplitMLP`); everything is restored on exit.
    Subclasses of ``nn.RoPE`` (scaled variants) are left alone."""
    swaps = _Swaps()
    mlx_lm_swiglu = cpu_fused.mlx_lm_swiglu()
    for module in model_modules(model):
        if getattr(module, "nn", None) is nn:
            swaps.attr(module, "nn", cpu_fused.FAST_NN)
        original = getattr(module, "swiglu", None)
        if original is not None and original is mlx_lm_swiglu:
            swaps.attr(module, "swiglu", cpu_fused.swiglu)
    tables: dict = {}
    for _, parent in model.named_modules():
        for key, child in list(parent.items()):
            if type(child) is nn.RoPE:
                swaps.child(parent, key, cpu_fused.TableRoPE(child, tables))
            elif key == "mlp" and isinstance(child, nn.Module) and is_dense_mlp(child):
                swaps.child(parent, key, RowSplitMLP(child))
    try:
        yield
    finally:
        swaps.restore()
