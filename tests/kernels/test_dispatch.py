"""The paged-attention dispatcher: back-end choice, warnings, and the first-use self-check that
keeps a wrong or broken native kernel away from users (checked here with fake back ends and
with the real Metal bodies running in the CPU emulator)."""

from __future__ import annotations

import os
import sys
import types
import warnings

import mlx.core as mx
import numpy as np
import pytest

import mlxpa.kernels as K
from mlxpa.kernels import _cases, _common, cascade_reference, cpu_paged_attention, reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_data"))
import emu_harness as H  # noqa: E402

NO_GPU = not (mx.metal.is_available() or mx.cuda.is_available())


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(K, "_verified", {})
    monkeypatch.setattr(K, "_warned", set())


def _decode_case(dtype=mx.float32):
    return _cases.random_case(0, dtype, 64, 8, 4, 2, [0, 1, 9, 20])


def _ref(case):
    return reference.paged_attention(case.q, case.kv)


def _fake(impl, calls=None, available=True, pass_variant=False):
    """A back end whose ``paged_attention`` (the real ones' signature) records ``variant``
    and returns ``impl(q, kv)``, passing ``variant`` on with ``pass_variant`` and ``lse``
    when set."""
    def paged_attention(q, kv, variant=None, lse=False):
        if calls is not None:
            calls.append(variant)
        kwargs = {"variant": variant} if pass_variant else {}
        if lse:
            kwargs["lse"] = True
        return impl(q, kv, **kwargs)

    return types.SimpleNamespace(is_available=lambda: available, paged_attention=paged_attention)


def _zero_empty_rows(q, kv):
    """A correct 'native kernel': the reference, with rows without keys set to zero."""
    out = reference.paged_attention(q, kv)
    return mx.where((kv.context_lens > 0)[:, None, None, None], out, 0)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a Metal or CUDA device")
def test_auto_is_cpu_kernel_without_gpu():
    assert K.resolve_backend("auto") == "cpu"
    case = _decode_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.paged_attention(case.q, case.kv, kernel="auto")
    assert mx.array_equal(out, cpu_paged_attention.paged_attention(case.q, case.kv))
    assert mx.allclose(out, _ref(case), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a Metal or CUDA device")
@pytest.mark.parametrize("kernel", ["metal", "cuda"])
def test_unavailable_kernel_warns_once_and_falls_back(kernel):
    case = _decode_case()
    with pytest.warns(RuntimeWarning, match=f"no {kernel} device"):
        out = K.paged_attention(case.q, case.kv, kernel=kernel)
    assert mx.array_equal(out, _ref(case))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        K.paged_attention(case.q, case.kv, kernel=kernel)


def test_unknown_kernel_raises():
    case = _decode_case()
    with pytest.raises(ValueError, match="kernel must be one of"):
        K.paged_attention(case.q, case.kv, kernel="triton")


def test_correct_native_kernel_is_used_after_its_check(monkeypatch):
    calls = []
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(_zero_empty_rows, calls))
    case = _decode_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.paged_attention(case.q, case.kv, kernel="metal")
        K.paged_attention(case.q, case.kv, kernel="metal")
    assert calls == ["v1", "v2", None, None]   # checked once (both variants), then used
    assert mx.array_equal(out, _zero_empty_rows(case.q, case.kv))


@pytest.mark.parametrize("bug", ["wrong", "nan", "nonzero-empty", "raises"])
def test_bad_native_kernel_warns_once_and_falls_back(monkeypatch, bug):
    def impl(q, kv):
        if bug == "raises":
            raise RuntimeError("Unable to build metal library from source")
        if bug == "nonzero-empty":   # rows without keys must be zeros
            return reference.paged_attention(q, kv)
        out = _zero_empty_rows(q, kv)
        if bug == "nan":             # the check case's row of block_size + 1 = 9 keys
            return mx.where((kv.context_lens == 9)[:, None, None, None], mx.nan, out)
        return out + 0.01

    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(impl))
    case = _decode_case()
    with pytest.warns(RuntimeWarning, match="failed its check"):
        out = K.paged_attention(case.q, case.kv, kernel="cuda")
    assert mx.array_equal(out, _ref(case))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = K.paged_attention(case.q, case.kv, kernel="cuda")
    assert mx.array_equal(again, _ref(case))


def test_prefill_and_unsupported_shapes_stay_on_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(_zero_empty_rows, calls))
    prefill = _cases.random_case(0, mx.float32, 64, 8, 4, 2, [5, 9])
    q = mx.concatenate([prefill.q] * 3, axis=2)                 # L = 3
    kv = prefill.kv._replace(query_start=prefill.kv.query_start - 2)
    out = K.paged_attention(q, kv, kernel="metal")
    assert mx.array_equal(out, reference.paged_attention(q, kv))
    odd = _cases.random_case(0, mx.float32, 96, 8, 4, 2, [5, 9])  # head_dim 96
    K.paged_attention(odd.q, odd.kv, kernel="metal")
    assert calls == []


def test_self_check_classes_are_separate(monkeypatch):
    calls = []
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(_zero_empty_rows, calls))
    for window in (None, 4, None):
        case = _decode_case()
        case = case._replace(kv=case.kv._replace(sliding_window=window))
        K.paged_attention(case.q, case.kv, kernel="metal")
    assert calls == ["v1", "v2", None, "v1", "v2", None, None]


def test_self_check_skips_v2_where_it_is_never_picked(monkeypatch):
    calls = []
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(_zero_empty_rows, calls))
    case = _cases.random_case(0, mx.float32, 256, 16, 32, 2, [3, 20])   # G=16, D=256
    K.paged_attention(case.q, case.kv, kernel="metal")
    assert calls == ["v1", None]


def test_choose_variant():
    def shape(batch, q_heads, kv_heads, d, max_blocks, window=0):
        return _common.DecodeShape(batch, q_heads, kv_heads, d, 16, max_blocks, window,
                                   mx.bfloat16)

    assert _common.choose_variant(shape(1, 4, 1, 256, 32)) == "v1"          # 512 keys
    assert _common.choose_variant(shape(1, 4, 1, 256, 33)) == "v2"          # 2 partitions
    assert _common.choose_variant(shape(64, 4, 1, 256, 256)) == "v1"        # 256 TGs fill
    assert _common.choose_variant(shape(64, 4, 1, 256, 1024)) == "v2"       # 16k keys
    assert _common.choose_variant(shape(1, 4, 1, 256, 1024, 512)) == "v1"   # window: 1 part
    assert _common.choose_variant(shape(1, 32, 2, 256, 1024)) == "v1"       # G=16, D=256


def test_choose_variant_cuda_follows_the_h200_sitting():
    """The H200 timings of docs/kernels.md: (ctx, batch) -> the faster variant, for
    Llama 3 8B's heads (32 q, 8 kv, D 128) and Gemma 3 270M's (4 q, 1 kv, D 256)."""
    def shape(batch, q_heads, kv_heads, d, ctx):
        return _common.DecodeShape(batch, q_heads, kv_heads, d, 16, ctx // 16, 0,
                                   mx.bfloat16)

    faster = {(32, 8, 128, 512, 1): "v1", (32, 8, 128, 512, 64): "v2",
              (32, 8, 128, 8192, 1): "v2", (32, 8, 128, 8192, 64): "v2",
              (4, 1, 256, 512, 1): "v1", (4, 1, 256, 512, 64): "v1",  # 0.084 / 0.087 ms
              (4, 1, 256, 8192, 1): "v2", (4, 1, 256, 8192, 64): "v2"}
    for (hq, hkv, d, ctx, batch), variant in faster.items():
        assert _common.choose_variant_cuda(shape(batch, hq, hkv, d, ctx)) == variant
    assert _common.choose_variant_cuda(shape(1, 32, 2, 256, 16384)) == "v1"  # no v2: G=16


@pytest.mark.skipif(H.unavailable_reason() is not None, reason=str(H.unavailable_reason()))
def test_emulated_metal_kernel_passes_the_dispatcher_check(monkeypatch):
    """The real Metal bodies (production 32 simdgroups, 512-token partitions) run in the
    emulator as the 'metal' back end: the self-check accepts them and decode uses them."""
    calls = []
    monkeypatch.setattr(K, "_load_backend",
                        lambda name: _fake(H.emulate_decode, calls, pass_variant=True))
    case = _cases.random_case(7, mx.float32, 64, 32, 1, 1, [3, 40])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.paged_attention(case.q, case.kv, kernel="metal")
    assert calls == ["v1", "v2", None]
    ref = np.array(_ref(case))
    assert np.allclose(np.array(out), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(H.unavailable_reason() is not None, reason=str(H.unavailable_reason()))
def test_emulated_metal_kernel_with_planted_bug_falls_back(monkeypatch):
    """The same, with the online-softmax rescale removed from v1: the check fails, a warning
    says so, and decode returns the reference's numbers."""
    from mlxpa.kernels.metal_paged_attention import SOURCES

    bad = {"v1": SOURCES["v1"].replace("acc[i] = acc[i] * alpha +", "acc[i] = acc[i] +")}
    assert bad["v1"] != SOURCES["v1"]

    def emulate(q, kv, **kwargs):
        return H.emulate_decode(q, kv, **kwargs, sources=bad)

    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(emulate, pass_variant=True))
    case = _cases.random_case(7, mx.float32, 64, 32, 1, 1, [3, 40])
    with pytest.warns(RuntimeWarning, match="failed its check.*v1: max error"):
        out = K.paged_attention(case.q, case.kv, kernel="metal")
    assert mx.array_equal(out, _ref(case))


def test_quantized_pools_are_their_own_self_check_class(monkeypatch):
    """Float and quantized pools of the same shape, and pools of other bits, are checked
    separately; the check case's pools are quantized the same way."""
    seen = []

    def impl(q, kv):
        seen.append(_common.pool_quant(kv.key_cache, kv.value_cache))
        return _zero_empty_rows(q, kv)

    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(impl))
    for quant in (None, (8, 8, 64), (8, 4, 64), (8, 8, 64)):
        case = _cases.random_case(0, mx.float32, 64, 8, 4, 2, [0, 1, 9, 20], quant=quant)
        out = K.paged_attention(case.q, case.kv, kernel="metal")
        assert mx.allclose(out, _zero_empty_rows(case.q, case.kv), atol=1e-5)
    # Two variants checked per new class, then the call itself.
    assert seen == [None, None, None, (8, 8, 64), (8, 8, 64), (8, 8, 64),
                    (8, 4, 64), (8, 4, 64), (8, 4, 64), (8, 8, 64)]


@pytest.mark.skipif(H.unavailable_reason() is not None, reason=str(H.unavailable_reason()))
def test_emulated_quantized_kernel_passes_the_check_and_a_planted_bug_falls_back(monkeypatch):
    """The real qv1/qv2 bodies (production sizes) in the emulator pass the dispatcher's
    check over k8v4 pools; with the value bias dropped from qv1 the check fails, a warning
    names the pools, and decode returns the reference's numbers."""
    from mlxpa.kernels.paged_attention_source import SOURCES

    case = _cases.random_case(7, mx.float32, 64, 32, 1, 1, [3, 40], quant=(8, 4, 64))
    calls = []
    monkeypatch.setattr(K, "_load_backend",
                        lambda name: _fake(H.emulate_decode, calls, pass_variant=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.paged_attention(case.q, case.kv, kernel="metal")
    assert calls == ["v1", "v2", None]
    assert np.allclose(np.array(out), np.array(_ref(case)), atol=1e-5, rtol=1e-5)

    text = " + float(vbi[i * 32 / GS]))"
    assert SOURCES["qv1"].count(text) == 1
    bad = {"qv1": SOURCES["qv1"].replace(text, ")")}
    monkeypatch.setattr(K, "_verified", {})
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(
        lambda q, kv, **k: H.emulate_decode(q, kv, **k, sources=bad), pass_variant=True))
    with pytest.warns(RuntimeWarning, match="pools 8-bit K / 4-bit V, group 64.*v1: max error"):
        out = K.paged_attention(case.q, case.kv, kernel="metal")
    assert mx.array_equal(out, _ref(case))


# ---------------------------------------------------------------- cascade attention


def _cascade_case(quant=None):
    from tests.kernels.test_cascade import make_case

    rng = np.random.default_rng(11)
    case = make_case(rng, [(3, [1, 9, 20])], [5], kv_heads=1, q_per_kv=2, head_dim=64,
                     block_size=16, quant=quant)
    c = case["cascade"]
    kv = K.PagedKV(case["kc"], case["vc"], c.block_tables,
                   mx.array(np.array(case["ctx"], np.int32)), mx.array(case["starts"]), 0.125,
                   key_start=c.key_start)
    return mx.array(case["q"].astype(np.float32)), kv, c.prefix


@pytest.mark.skipif(not NO_GPU, reason="this machine has a Metal or CUDA device")
def test_cascade_auto_is_the_cpu_kernel_without_gpu():
    args = _cascade_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.cascade_attention(*args, kernel="auto")
    assert mx.array_equal(out, cpu_paged_attention.cascade_attention(*args))
    assert mx.allclose(out, cascade_reference.cascade_attention(*args), atol=1e-5)


def test_cascade_lse_twins_are_a_class_of_their_own(monkeypatch):
    """The own-keys part runs the native kernel's `_lse` twin after its own check (both
    variants, with `lse=True`); plain decode of the same shape is checked apart."""
    calls = []

    def impl(q, kv, lse=False):
        calls.append(lse)
        out = (cascade_reference.paged_attention_lse if lse else _zero_empty_rows)(q, kv)
        if lse:   # rows without keys: zeros and a very negative log-sum-exp, as the kernels
            empty = (kv.context_lens == 0)[:, None, None]
            return mx.where(empty[..., None], 0, out[0]), mx.where(empty, -3e38, out[1])
        return out

    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(impl))
    args = _cascade_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.cascade_attention(*args, kernel="cuda")
        K.cascade_attention(*args, kernel="cuda")
    assert calls == [True, True, True, True]          # v1, v2 checked once, then used twice
    assert mx.allclose(out, cascade_reference.cascade_attention(*args), atol=1e-5)
    assert len(K._verified) == 1 and list(K._verified)[0][-1] is True


@pytest.mark.skipif(H.unavailable_reason() is not None, reason=str(H.unavailable_reason()))
def test_emulated_metal_lse_twins_serve_cascade_and_a_planted_bug_falls_back(monkeypatch):
    """The real v1_lse / reduce_lse bodies (production sizes) in the emulator pass the
    dispatcher's check and give the reference cascade's numbers; with the maximum dropped
    from v1_lse's log-sum-exp the check fails, a warning says so, and cascade attention
    returns the reference's numbers."""
    from mlxpa.kernels.paged_attention_source import SOURCES

    args = _cascade_case()
    want = cascade_reference.cascade_attention(*args)
    calls = []
    monkeypatch.setattr(K, "_load_backend",
                        lambda name: _fake(H.emulate_decode, calls, pass_variant=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.cascade_attention(*args, kernel="metal")
    assert calls == ["v1", "v2", None]
    assert np.allclose(np.array(out), np.array(want), atol=1e-5, rtol=1e-5)

    text = "gm + metal::log(gl)"
    bad = {"v1_lse": SOURCES["v1_lse"].replace(text, "metal::log(gl)")}
    assert bad["v1_lse"] != SOURCES["v1_lse"]
    monkeypatch.setattr(K, "_verified", {})
    monkeypatch.setattr(K, "_load_backend", lambda name: _fake(
        lambda q, kv, **k: H.emulate_decode(q, kv, **k, sources=bad), pass_variant=True))
    with pytest.warns(RuntimeWarning, match="cascade .*failed its check.*v1_lse: log-sum-exp"):
        out = K.cascade_attention(*args, kernel="metal")
    assert mx.array_equal(out, want)
