"""The Metal paged-attention kernels on an Apple GPU against the reference (skipped elsewhere;
on Linux the same bodies run in ``test_emu.py``)."""

from __future__ import annotations

import warnings

import mlx.core as mx
import pytest

import mlxpa.kernels as K
from mlxpa.kernels import _cases, metal_paged_attention

pytestmark = pytest.mark.skipif(not mx.metal.is_available(), reason="needs a Metal GPU")

TOL = {mx.float32: 1e-4, mx.float16: 2e-3, mx.bfloat16: 2e-3}
SHAPES = [(64, 8, 4, 4, None), (128, 16, 8, 2, 20), (256, 32, 8, 1, None),
          (256, 16, 4, 1, 512)]   # head_dim, block_size, q_heads, kv_heads, window


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("d,bs,hq,hkv,window", SHAPES)
def test_metal_matches_reference(dtype, variant, d, bs, hq, hkv, window):
    lens = [0, 1, bs - 1, bs + 1, 700, 1500]
    for trim in (False, True) if window else (False,):
        case = _cases.random_case(0, dtype, d, bs, hq, hkv, lens, window, trim)
        out = metal_paged_attention.paged_attention(case.q, case.kv, variant=variant)
        why = _cases.mismatch(out, _cases.reference_f32(case), case.kv.context_lens,
                              TOL[dtype], TOL[dtype])
        assert why is None, why


def test_dispatcher_uses_metal_without_warning(monkeypatch):
    monkeypatch.setattr(K, "_verified", {})
    case = _cases.random_case(1, mx.bfloat16, 256, 16, 4, 1, [1, 33, 600])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = K.paged_attention(case.q, case.kv, kernel="auto")
    assert all(K._verified.values()) and K._verified
    assert _cases.mismatch(out, _cases.reference_f32(case), case.kv.context_lens, 2e-3,
                           2e-3) is None
