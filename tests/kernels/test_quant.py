"""Attention over quantized pools (``--kv-cache-dtype``) against a float64
dequantize-then-attend oracle, on the reference and on the CPU kernel (decode in place with
``mx.gather_qmm``; prefill chunks over a cached prefix gather and dequantize).

The oracle unpacks the packed words, scales and biases with numpy in float64 (its own reading
of MLX's affine format: element ``e`` is ``scale * ((word >> (e * bits % 32)) & mask) + bias``,
independent of ``mx.dequantize``) and attends with :func:`tests.kernels.test_reference.oracle`.
Cases cross block boundaries (contexts of 1, ``block_size - 1``, ``block_size``,
``block_size + 1`` and several blocks), end in partial blocks, run sliding windows over full
and trimmed tables, mix prefill chunks (a cached prefix plus new tokens) with decodes, and
fill every slot a row does not own with huge values, so a read of a masked key shows.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import PagedKV, cpu_paged_attention, reference
from mlxpa.kernels.quant import QuantizedPool, dense, dequantize, quantize
from tests.kernels.test_reference import make_case, oracle, window_tables

IMPLS = {"reference": reference.paged_attention, "cpu": cpu_paged_attention.paged_attention}
# (kbits, vbits, group_size): int8, int4, k8v4 at the default group, and the other groups.
QUANTS = [(8, 8, 64), (4, 4, 64), (8, 4, 64), (4, 4, 32), (8, 8, 128)]
BS = 8


def unpack_f64(pool: QuantizedPool) -> np.ndarray:
    """Float64 values of a quantized pool, unpacked with numpy."""
    words = np.array(pool.packed).astype(np.uint64)
    per_word = 32 // pool.bits
    shifts = (np.arange(per_word) * pool.bits).astype(np.uint64)
    q = (words[..., None] >> shifts) & np.uint64((1 << pool.bits) - 1)
    q = q.reshape(*words.shape[:-1], -1).astype(np.float64)
    scales = np.repeat(np.array(pool.scales.astype(mx.float32), np.float64), pool.group_size, -1)
    biases = np.repeat(np.array(pool.biases.astype(mx.float32), np.float64), pool.group_size, -1)
    return q * scales + biases


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("bits,group_size", [(8, 64), (4, 64), (4, 32), (8, 128)])
def test_dequantize_is_mx_dequantize_and_the_affine_formula(dtype, bits, group_size):
    x = (mx.random.normal((3, 2, 5, 256), key=mx.random.key(bits + group_size)) * 4
         ).astype(dtype)
    pool = quantize(x, bits, group_size)
    got = dequantize(pool)
    want = mx.dequantize(*pool.arrays, group_size=group_size, bits=bits)
    assert got.dtype == want.dtype == dtype and got.shape == x.shape == pool.shape
    assert mx.array_equal(got, want)   # bit-identical to MLX's own
    # In half precision MLX rounds scale * q and the sum (two roundings at the magnitude of
    # the group's range); float32 is exact to an ulp.
    f64 = unpack_f64(pool)
    atol = 1e-5 if dtype == mx.float32 else 2e-2 * np.abs(f64).max()
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), f64, rtol=1e-6, atol=atol)
    assert dense(x) is x


def _quantized(case: dict, quant: tuple[int, int, int], dtype: mx.Dtype):
    """The case's pools quantized (scales in ``dtype``), and a float64 case holding their
    dequantized values for the oracle."""
    kbits, vbits, gs = quant
    kq = quantize(mx.array(case["key_cache"], mx.float32).astype(dtype), kbits, gs)
    vq = quantize(mx.array(case["value_cache"], mx.float32).astype(dtype), vbits, gs)
    f64 = dict(case, key_cache=unpack_f64(kq), value_cache=unpack_f64(vq))
    return kq, vq, f64


def _run(impl: str, case: dict, kq, vq, scale: float, dtype=mx.float32, **kwargs) -> np.ndarray:
    tables = kwargs.pop("block_tables", case["block_tables"])
    key_start = kwargs.pop("key_start", None)
    kv = PagedKV(kq, vq, mx.array(tables), mx.array(case["context_lens"]),
                 mx.array(case["query_start"]), scale,
                 key_start=None if key_start is None else mx.array(key_start), **kwargs)
    out = IMPLS[impl](mx.array(case["q"]).astype(dtype), kv)
    assert out.dtype == dtype
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    assert np.isfinite(got).all()
    return got


def _check(got: np.ndarray, case: dict, ref: list[np.ndarray], tol: float) -> None:
    for b, expected in enumerate(ref):
        n = case["num_new"][b]
        np.testing.assert_allclose(got[b, :, :n], expected, rtol=tol, atol=tol,
                                   err_msg=f"row {b}")


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: "k{}v{}g{}".format(*q))
def test_decode_across_block_boundaries(impl, quant):
    """Decode rows whose contexts end at 1, bs - 1, bs, bs + 1 and 3 bs + 5 keys (partial and
    full last blocks), GQA 4 query heads over 2 KV heads; the CPU kernel reads the pool in
    place (``gather_qmm``)."""
    rng = np.random.default_rng(sum(quant))
    rows = [(n - 1, 1) for n in (1, BS - 1, BS, BS + 1, 3 * BS + 5)]
    case = make_case(rng, rows, block_size=BS, head_dim=128, garbage=1e4)
    kq, vq, f64 = _quantized(case, quant, mx.float32)
    scale = 128 ** -0.5
    _check(_run(impl, case, kq, vq, scale), case, oracle(f64, scale), 1e-4)


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("quant", QUANTS[:3], ids=lambda q: "k{}v{}g{}".format(*q))
def test_prefill_over_a_cached_quantized_prefix(impl, quant, monkeypatch):
    """Prefill chunks after a cached prefix (17 and 32 cached tokens), a fresh prompt and a
    decode in one padded batch; query tiles of 4 rows on the CPU kernel."""
    monkeypatch.setattr(cpu_paged_attention, "QUERY_TILE", 4)
    rng = np.random.default_rng(7)
    rows = [(0, 20), (17, 9), (32, 1), (5, 3)]
    case = make_case(rng, rows, q_heads=8, kv_heads=1, block_size=BS, head_dim=64,
                     garbage=1e4)
    kq, vq, f64 = _quantized(case, quant, mx.float32)
    scale = 64 ** -0.5
    _check(_run(impl, case, kq, vq, scale), case, oracle(f64, scale), 1e-4)


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("trim", [False, True])
@pytest.mark.parametrize("length", [1, 6])
def test_sliding_window_over_quantized_blocks(impl, trim, length):
    """A 5-token window (Gemma 3's local layers, smaller): decode and prefill rows, tables
    full or trimmed to the window (``key_start``) as the runner builds them, k8v4."""
    rng = np.random.default_rng(11 + length)
    rows = [(s, length) for s in (0, 3, BS - 1, 2 * BS + 3, 4 * BS)]
    case = make_case(rng, rows, block_size=BS, head_dim=64, garbage=1e4)
    kq, vq, f64 = _quantized(case, (8, 4, 64), mx.float32)
    kwargs = {}
    if trim:
        tables, key_start = window_tables(case, 5)
        kwargs = {"block_tables": tables, "key_start": key_start}
    scale = 64 ** -0.5
    got = _run(impl, case, kq, vq, scale, sliding_window=5, **kwargs)
    _check(got, case, oracle(f64, scale, sliding_window=5), 1e-4)


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_half_precision_scales(impl, dtype):
    """Scales and biases in the compute dtype (a bfloat16 / float16 model): the CPU kernel
    gathers and dequantizes (no in-place decode), both compute in float32."""
    rng = np.random.default_rng(3)
    rows = [(0, 1), (BS, 1), (2 * BS + 2, 4)]
    case = make_case(rng, rows, block_size=BS, head_dim=64, garbage=100.0)
    kq, vq, f64 = _quantized(case, (8, 8, 64), dtype)
    f64["q"] = np.array(mx.array(case["q"], mx.float32).astype(dtype).astype(mx.float32))
    scale = 64 ** -0.5
    got = _run(impl, case, kq, vq, scale, dtype=dtype)
    _check(got, case, oracle(f64, scale), 2e-2)


def test_cpu_decode_reads_the_pool_in_place(monkeypatch):
    """Decode with float32 scales goes through ``gather_qmm`` on the pool itself (no gather
    of the quantized arrays); prefill does gather."""
    calls = []
    real = mx.gather_qmm
    monkeypatch.setattr(mx, "gather_qmm", lambda *a, **k: calls.append(a[1].shape) or
                        real(*a, **k))
    rng = np.random.default_rng(5)
    case = make_case(rng, [(9, 1), (20, 1)], block_size=BS, head_dim=64, garbage=1.0)
    kq, vq, _ = _quantized(case, (8, 4, 64), mx.float32)
    _run("cpu", case, kq, vq, 0.125)
    n = kq.packed.shape[0] * kq.packed.shape[1]
    assert calls == [(n, BS, 64 * 8 // 32), (n, BS, 64 * 4 // 32)]
    calls.clear()
    prefill = make_case(rng, [(9, 3)], block_size=BS, head_dim=64, garbage=1.0)
    kq, vq, _ = _quantized(prefill, (8, 8, 64), mx.float32)
    _run("cpu", prefill, kq, vq, 0.125)
    assert calls == []
