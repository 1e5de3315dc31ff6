"""Fused element-wise kernels for MLX's CPU back end: tanh-GELU, SiLU and table RoPE.

On MLX's CPU back end the transcendental element-wise ops (``exp``, ``tanh``, ``sin``,
``cos``) run as one thread of scalar code, while ``mul``/``add`` run at memory speed and
``mx.compile`` fuses chains of them into one pass; in a prefill step Gemma's ``gelu_approx``
and ``mx.fast.rope`` cost more than the matmuls next to them. So on the CPU the model runner
swaps (:func:`mlxpa.worker.patches.fused_cpu_ops`), for its forward pass only (mlx-lm's own
calls are untouched):

- ``nn.gelu_approx`` / ``nn.silu`` / ``swiglu`` for versions built on a rational ``tanh``
  (only ``mul``, ``add``, ``div`` and ``clip``, fused by ``mx.compile``; within 2 float32
  ulp-scale error of float64 ``tanh``): Eigen's ``generic_fast_tanh_float``, the degree 13/6
  odd rational XLA's CPU back end uses, with the coefficients published there;
- ``nn.RoPE`` modules for :class:`TableRoPE`, which computes each step's cos/sin tables once
  per distinct (base, scale, dims) and position set, in float64, and shares them across
  layers (vLLM's ``rotary_embedding`` cos/sin cache); each layer then only multiplies and adds.

The activations are compiled per input shape, not ``shapeless``: a shape-specialised kernel
over contiguous inputs runs one flat loop, where MLX's shapeless CPU kernels index every input
through strides. Metal and CUDA have fast native ops, so nothing is swapped there. Measured
costs: ``docs/kernels.md``.
"""

from __future__ import annotations

import math
import types

import mlx.core as mx
import mlx.nn as nn

# Eigen's generic_fast_tanh_float: tanh(x) ~ x * P(x^2) / Q(x^2) on |x| <= 7.905311, where
# float32 tanh rounds to +-1.
_TANH_CLAMP = 7.90531110763549805
_TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
           5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
           -2.76076847742355e-16)
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
           1.19825839466702e-06)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _poly(x2: mx.array, coeffs: tuple[float, ...]) -> mx.array:
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * x2 + c
    return acc


def _tanh(x: mx.array) -> mx.array:
    x = mx.clip(x, -_TANH_CLAMP, _TANH_CLAMP)
    x2 = x * x
    return x * _poly(x2, _TANH_P) / _poly(x2, _TANH_Q)


@mx.compile
def tanh(x: mx.array) -> mx.array:
    """Rational ``tanh`` of a float array (any shape, same dtype out); absolute error below
    1e-6 against float64 ``tanh`` in float32 (Eigen's ``generic_fast_tanh_float``)."""
    return _tanh(x)


@mx.compile
def gelu_tanh(x: mx.array) -> mx.array:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, the formula of ``nn.gelu_approx``
    (Hendrycks & Gimpel 2016), with the rational ``tanh``; any shape, same dtype out."""
    return 0.5 * x * (1.0 + _tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


@mx.compile
def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)`` as ``0.5 x (1 + tanh(x / 2))`` with the rational ``tanh``."""
    return 0.5 * x * (1.0 + _tanh(0.5 * x))


@mx.compile
def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """``silu(gate) * x`` (mlx-lm's ``swiglu``), fused."""
    return 0.5 * gate * (1.0 + _tanh(0.5 * gate)) * x


class _FastNN(types.ModuleType):
    """Stands in for ``mlx.nn`` inside a model module: the activations above, the rest of
    ``mlx.nn`` unchanged."""

    gelu_approx = staticmethod(gelu_tanh)
    silu = staticmethod(silu)

    def __getattr__(self, name: str):
        return getattr(nn, name)


FAST_NN = _FastNN("mlx.nn")


class TableRoPE(nn.Module):
    """RoPE (Su et al., RoFormer 2021) for ``[B, heads, L, D]`` inputs with per-row ``[B]``
    int32 offsets, from cos/sin tables computed once per step and shared by every layer with
    the same ``(dims, base, scale, traditional)``.

    Args:
        rope: The ``nn.RoPE`` it replaces (its ``dims``, ``traditional``, ``base``, ``scale``).
        tables: Cache shared by the layers of one forward pass, keyed by the offsets array's
            id (the runner passes one array to every layer), ``L`` and the RoPE settings.

    Calls with an ``int`` offset or another input rank go to the wrapped module.
    """

    def __init__(self, rope: nn.RoPE, tables: dict) -> None:
        super().__init__()
        self._rope = rope
        self._tables = tables

    def _cos_sin(self, offset: mx.array, length: int) -> tuple[mx.array, mx.array]:
        r = self._rope
        key = (id(offset), length, r.dims, r.base, r.scale)
        hit = self._tables.get(key)
        if hit is not None and hit[0] is offset:
            return hit[1], hit[2]
        half = r.dims // 2
        inv_freq = mx.power(mx.array(r.base, mx.float64),
                            -mx.arange(half, dtype=mx.float64) / half)
        pos = (offset[:, None] + mx.arange(length)[None, :]).astype(mx.float64) * r.scale
        theta = pos[:, None, :, None] * inv_freq                  # [B, 1, L, half]
        cos, sin = mx.cos(theta).astype(mx.float32), mx.sin(theta).astype(mx.float32)
        self._tables[key] = (offset, cos, sin)
        return cos, sin

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if not isinstance(offset, mx.array) or offset.ndim != 1 or x.ndim != 4:
            return self._rope(x, offset=offset)
        cos, sin = self._cos_sin(offset, x.shape[2])
        return _apply_rope(x, cos.astype(x.dtype), sin.astype(x.dtype), self._rope.dims,
                           self._rope.traditional)


@mx.compile
def _rotate(a: mx.array, b: mx.array, cos: mx.array, sin: mx.array) -> tuple[mx.array,
                                                                             mx.array]:
    # One fused pass for both halves, compiled per shape (bit-identical to two passes).
    return a * cos - b * sin, a * sin + b * cos


def _apply_rope(x: mx.array, cos: mx.array, sin: mx.array, dims: int,
                traditional: bool) -> mx.array:
    rot, rest = (x, None) if dims == x.shape[-1] else (x[..., :dims], x[..., dims:])
    if traditional:
        pairs = rot.reshape(*rot.shape[:-1], dims // 2, 2)
        out = mx.stack(_rotate(pairs[..., 0], pairs[..., 1], cos, sin), axis=-1)
        out = out.reshape(rot.shape)
    else:
        out = mx.concatenate(_rotate(rot[..., : dims // 2], rot[..., dims // 2:], cos, sin),
                             axis=-1)
    return out if rest is None else mx.concatenate([out, rest], axis=-1)


def mlx_lm_swiglu():
    """mlx-lm's own ``swiglu`` (what :func:`swiglu` replaces), or None in versions without it."""
    try:
        from mlx_lm.models.activations import swiglu as mlx_lm_swiglu
    except ImportError:
        return None
    return mlx_lm_swiglu
