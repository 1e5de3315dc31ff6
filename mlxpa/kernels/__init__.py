"""Paged-attention kernels: the MLX-ops reference (the spec) and a self-checked native path.

``paged_attention`` picks the back end from ``kernel`` (``--attention-backend``):
``auto`` takes Metal, then CUDA, then (when the default device is the CPU) the CPU kernel,
then the reference; ``metal``, ``cuda`` and ``cpu`` force one, with a warning (once) and the
reference where its device is absent; ``reference`` is gather +
``mx.fast.scaled_dot_product_attention``. Only decode (``L == 1``) with a supported shape goes
to Metal or CUDA; every back end reads quantized pools
(:class:`~mlxpa.kernels.quant.QuantizedPool`).

The first time a native kernel meets a shape class (back end, dtype, head dim, block size,
window, heads, the pools' bits and group size) it runs each variant on small random cases
(rows of 0, 1, ``block_size + 1`` and 600 keys) and compares them with the float32 reference
on the CPU; on a mismatch or a failure to compile or run it warns once and that class takes
the reference from then on. So a kernel never run on real hardware cannot silently give wrong
numbers.

``cascade_attention`` (the shared prefix once per group, each row's own keys apart, merged by
their log-sum-exp; specified by :mod:`mlxpa.kernels.cascade_reference`) runs the CPU kernel's
own version on the CPU; on Metal and CUDA decode rows' own keys go through the kernels'
``_lse`` twins (self-checked as a class of their own) and the shared prefixes through MLX ops;
prefill chunks, other back ends and classes whose check failed take the reference.
"""

from __future__ import annotations

import importlib
import warnings

import mlx.core as mx

from mlxpa.config import KERNELS
from mlxpa.kernels import _cases, _common, cascade_reference, reference
from mlxpa.kernels.paged_kv import PagedKV

_MODULES = {"metal": "mlxpa.kernels.metal_paged_attention",
            "cuda": "mlxpa.kernels.cuda_paged_attention",
            "cpu": "mlxpa.kernels.cpu_paged_attention"}
# Self-check tolerance (atol = rtol) per dtype: looser than the emulator tests' 1e-5 / 2e-3
# for device math; the short check rows (1 and block_size + 1 keys) turn an indexing or
# softmax bug into errors of order 0.1.
CHECK_TOLERANCE = {mx.float32: 1e-4, mx.float16: 4e-3, mx.bfloat16: 4e-3}

_verified: dict[tuple, bool] = {}
_warned: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _load_backend(name: str):
    return importlib.import_module(_MODULES[name])


def resolve_backend(kernel: str) -> str:
    """``metal``, ``cuda``, ``cpu`` or ``reference`` for an ``--attention-backend`` value on this
    machine.

    Raises:
        ValueError: ``kernel`` is not one of ``KERNELS``.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "auto":
        for name in ("metal", "cuda", "cpu"):
            if _load_backend(name).is_available():
                return name
        return "reference"
    if kernel != "reference" and not _load_backend(kernel).is_available():
        _warn_once(("unavailable", kernel),
                   f"kernel={kernel!r}: this MLX build or default device has no {kernel} "
                   "device; "
                   "paged attention uses the reference")
        return "reference"
    return kernel


def self_check(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int, window: int,
               q_heads: int, kv_heads: int, quant: tuple[int, int, int] | None = None,
               lse: bool = False) -> str | None:
    """Run ``backend``'s variants (v1, and v2 where it may be picked) on a random case of this
    shape class (``quant``: ``(kbits, vbits, group_size)`` of quantized pools; ``lse``: the
    ``_lse`` twins, on rows whose keys start 0-2 blocks in, output and log-sum-exp) against
    the reference; return why one fails (mismatch or exception text), or None when all
    match."""
    module = _load_backend(backend)
    lens = [0, 1, block_size + 1, 600]
    case = _cases.random_case(0, dtype, head_dim, block_size, q_heads, kv_heads, lens,
                              window=window or None, trim=bool(window), quant=quant,
                              skip_blocks=[0, 0, 1, 2] if lse else None)
    tol = CHECK_TOLERANCE[dtype]
    extra = {"lse": True} if lse else {}
    try:
        ref = _cases.reference_f32(case, lse)
        for variant in _common.variants(q_heads, kv_heads, head_dim):
            out = module.paged_attention(case.q, case.kv, variant=variant, **extra)
            mx.eval(out)
            why = (_cases.lse_mismatch if lse else _cases.mismatch)(
                out, ref, case.kv.context_lens, tol, tol)
            if why:
                return f"{variant}{'_lse' if lse else ''}: {why}"
    except Exception as e:  # noqa: BLE001 - a compile error must fall back, not crash
        return f"{type(e).__name__}: {e}"
    return None


def _checked(backend: str, q: mx.array, kv: PagedKV, lse: bool = False) -> bool:
    """Whether ``backend``'s native kernel serves this call: a supported shape whose class
    passed its first-use :func:`self_check` (run now when new; a failure warns once)."""
    if not _common.supported(q, kv):
        return False
    window = kv.sliding_window or 0
    quant = _common.pool_quant(kv.key_cache, kv.value_cache)
    cls = (backend, q.dtype, q.shape[3], kv.key_cache.shape[2], window, q.shape[1],
           kv.key_cache.shape[1], quant, lse)
    if cls not in _verified:
        why = self_check(*cls)
        _verified[cls] = why is None
        if why:
            pools = "" if quant is None else ", pools {}-bit K / {}-bit V, group {}".format(
                *quant)
            what = "cascade (log-sum-exp) " if lse else ""
            _warn_once(("check",) + cls,
                       f"{backend} {what}paged-attention kernel failed its check against the "
                       f"reference for dtype={q.dtype}, head_dim={cls[2]}, block_size="
                       f"{cls[3]}, window={window}, heads={cls[5]}/{cls[6]}{pools} "
                       f"({why}); using the reference")
    return _verified[cls]


def paged_attention(q: mx.array, kv: PagedKV, *, kernel: str = "auto") -> mx.array:
    """Paged attention through the chosen back end; arguments, shapes and the result as
    ``reference.paged_attention`` (PagedAttention, Kwon et al. 2023; vLLM), pools float or
    quantized. With ``kv.sinks`` (per-head sink logits) the CPU kernel or the reference runs;
    the native kernels have no sink term.

    Args:
        kernel: ``auto``, ``reference``, ``cpu``, ``metal`` or ``cuda`` (see the module
            docstring).

    Raises:
        ValueError: Unknown ``kernel``.
    """
    backend = resolve_backend(kernel)
    if backend == "cpu":
        return _load_backend("cpu").paged_attention(q, kv)
    if backend != "reference" and kv.sinks is None and _checked(backend, q, kv):
        return _load_backend(backend).paged_attention(q, kv)
    return reference.paged_attention(q, kv)


def cascade_attention(q: mx.array, kv: PagedKV, prefix: cascade_reference.CascadePrefix, *,
                      kernel: str = "auto") -> mx.array:
    """Cascade attention of decode rows or prefill chunks through the chosen back end;
    arguments, shapes and the result as ``cascade_reference.cascade_attention`` (Hydragen,
    Juravsky et al. 2024; FlashInfer's cascade inference), pools float or quantized, sinks
    counted once in the merge on every back end (see the module docstring for who runs what).

    Raises:
        ValueError: Unknown ``kernel``.
    """
    backend = resolve_backend(kernel)
    if backend == "cpu":
        return _load_backend("cpu").cascade_attention(q, kv, prefix)
    if backend != "reference" and _checked(backend, q, kv, lse=True):
        out, lse = _load_backend(backend).paged_attention(q, kv, lse=True)
        return cascade_reference.cascade_merge(q, kv, prefix, out, lse)
    return cascade_reference.cascade_attention(q, kv, prefix)


__all__ = ["KERNELS", "PagedKV", "cascade_attention", "paged_attention", "resolve_backend",
           "self_check"]
