"""Quantized K/V pools: mlx-lm's affine group quantization, per token, along head_dim.

A quantized pool keeps, for every stored K (or V) row of ``D`` elements, ``D * bits / 32``
packed ``uint32`` words and ``D / group_size`` scales and biases in the compute dtype: exactly
what ``mx.quantize(x, group_size, bits)`` returns for the row, and what mlx-lm's
``QuantizedKVCache`` stores. Element ``e`` of a row is ``scales[e // group_size] * q_e +
biases[e // group_size]`` with ``q_e = (packed[e * bits // 32] >> (e * bits % 32)) &
(2**bits - 1)`` (MLX's ``affine`` mode; the lowest bits hold the first element).

Rows are quantized one token at a time when they are written, so a block is never
re-quantized and each token's values do not depend on its neighbours (KIVI, Liu et al. 2024,
quantizes keys per channel instead; per-token keeps prefix sharing and copy-on-write exact).

On MLX's CPU back end ``mx.dequantize`` runs as one thread of scalar code, slower than the
gather it follows; :func:`dequantize` there unpacks with a view and shifts fused by
``mx.compile``, bit-identical to ``mx.dequantize``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx

from mlxpa.kernels.device import on_cpu


class QuantizedPool(NamedTuple):
    """One quantized K or V pool, or a gather of one (``mx.eval`` evaluates its arrays).

    Attributes:
        packed: ``[..., D * bits / 32]`` uint32.
        scales: ``[..., D / group_size]`` in the compute dtype.
        biases: ``[..., D / group_size]`` in the compute dtype.
        bits: Bits per element (4 or 8).
        group_size: Elements sharing one scale and bias (32, 64 or 128).
    """

    packed: mx.array
    scales: mx.array
    biases: mx.array
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dequantized array."""
        return (*self.scales.shape[:-1], self.scales.shape[-1] * self.group_size)

    @property
    def dtype(self) -> mx.Dtype:
        """The dtype it dequantizes to (of the scales)."""
        return self.scales.dtype

    @property
    def arrays(self) -> tuple[mx.array, mx.array, mx.array]:
        return self.packed, self.scales, self.biases

    def map(self, fn: Callable[[mx.array], mx.array]) -> QuantizedPool:
        """``fn`` (an index or reshape over the leading axes) applied to all three arrays."""
        return QuantizedPool(fn(self.packed), fn(self.scales), fn(self.biases), self.bits,
                             self.group_size)


def quantize(x: mx.array, bits: int, group_size: int) -> QuantizedPool:
    """``mx.quantize`` of ``x`` (``[..., D]``, D a multiple of ``group_size``) as a pool."""
    packed, scales, biases = mx.quantize(x, group_size=group_size, bits=bits)
    return QuantizedPool(packed, scales, biases, bits, group_size)


def zeros(shape: tuple[int, ...], bits: int, group_size: int, dtype: mx.Dtype) -> QuantizedPool:
    """An all-zero pool holding ``shape`` (``[..., D]``) elements."""
    *lead, d = shape
    return QuantizedPool(mx.zeros((*lead, d * bits // 32), mx.uint32),
                         mx.zeros((*lead, d // group_size), dtype),
                         mx.zeros((*lead, d // group_size), dtype), bits, group_size)


def row_bytes(dim: int, bits: int, group_size: int, dtype: mx.Dtype) -> int:
    """Bytes one quantized row of ``dim`` elements takes: packed words, scales, biases."""
    return dim * bits // 8 + 2 * (dim // group_size) * dtype.size


def _unpack(packed: mx.array, scales: mx.array, biases: mx.array, bits: int) -> mx.array:
    """``[N, G, group_size * bits / 32]`` words, ``[N, G, 1]`` scales/biases to ``[N, G,
    group_size]`` values (the affine formula in the scales' dtype, as ``mx.dequantize``)."""
    if bits == 8:   # little-endian bytes: byte j of a word is element j
        q = packed.view(mx.uint8)
    else:
        shifts = mx.arange(0, 32, bits, dtype=mx.uint32)
        q = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    q = q.reshape(*scales.shape[:2], -1).astype(scales.dtype)
    return q * scales + biases


@functools.cache
def _compiled_unpack(bits: int) -> Callable[..., mx.array]:
    return mx.compile(functools.partial(_unpack, bits=bits))


def dequantize(pool: QuantizedPool) -> mx.array:
    """The values of ``pool`` (``[..., D]`` in its scales' dtype), as ``mx.dequantize``."""
    if not on_cpu():
        return mx.dequantize(*pool.arrays, group_size=pool.group_size, bits=pool.bits)
    shape = pool.shape
    groups = pool.scales.shape[-1]
    n = pool.scales.size // groups if groups else 0
    words = pool.packed.reshape(n, groups, -1)
    out = _compiled_unpack(pool.bits)(words, pool.scales.reshape(n, groups, 1),
                                      pool.biases.reshape(n, groups, 1))
    return out.reshape(shape)


def dense(cache: mx.array | QuantizedPool) -> mx.array:
    """``cache`` itself, or its dequantized values."""
    return dequantize(cache) if isinstance(cache, QuantizedPool) else cache
