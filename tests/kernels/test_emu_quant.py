"""The quantized-pool Metal kernels (``qv1``, ``qv2``: K/V stored as packed words, scales and
biases, ``--kv-cache-dtype``) run on the CPU in ``tests/tools/msl_emu`` against the float32
reference over the same quantized pools (dequantize-then-attend), and planted bugs in the new
dequantize code must be caught.

Instances cover every dtype (of q and of the scales), head dims 64/128/256, block sizes
8/16/32, GQA 1/4/8, windows on full and trimmed tables, 8 and 4 bits, 8-bit keys with 4-bit
values, group sizes 32/64/128; rows of 0, 1, block size +- 1 and several blocks (the tests'
4 simdgroups per v1 threadgroup and 16-token v2 partitions), and the production 32
simdgroups / 512-token partitions once. Tolerance as ``test_emu`` but 4e-3 for bfloat16: a
dequantized value is not a bfloat16 number, so the output's own rounding (up to 2^-8
relative, just above a power of two) shows, where one-key rows of ``test_emu`` are exact.
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_data"))
import emu_harness as H  # noqa: E402

from mlxpa.kernels import _cases, _common  # noqa: E402
from mlxpa.kernels.paged_attention_source import SOURCES  # noqa: E402

pytestmark = pytest.mark.skipif(H.unavailable_reason() is not None,
                                reason=str(H.unavailable_reason()))

TOL = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 4e-3}

# (dtype, head_dim, block_size, q_heads, kv_heads, window, trim, (kbits, vbits, group_size))
INSTANCES = [
    (mx.float32, 64, 8, 2, 2, None, False, (8, 8, 64)),
    (mx.float16, 128, 16, 8, 2, 20, True, (4, 4, 32)),
    (mx.bfloat16, 256, 32, 8, 1, None, False, (8, 4, 64)),
    (mx.float32, 128, 32, 8, 1, 24, False, (4, 4, 128)),
    (mx.bfloat16, 64, 16, 4, 4, 5, True, (8, 8, 32)),
]


def _id(inst) -> str:
    dtype, d, bs, hq, hkv, window, trim, (kb, vb, gs) = inst
    name = str(dtype).split(".")[-1]
    return f"{name}-d{d}-bs{bs}-g{hq // hkv}-w{window or 0}{'t' if trim else ''}-k{kb}v{vb}g{gs}"


def _case(inst) -> _cases.Case:
    dtype, d, bs, hq, hkv, window, trim, quant = inst
    return H.make_case(1, dtype, d, bs, hq, hkv, [0, 1, bs - 1, bs + 1, 3 * bs + 5], window,
                       trim, quant=quant)


def _prod_case() -> _cases.Case:
    return H.make_case(3, mx.bfloat16, 64, 16, 4, 2, [1, 1100, 530, 17], quant=(8, 4, 64))


# A k8v4 case with head_dim 128 and groups of 64 (two groups per row, two elements of a lane
# per group), so swapped K/V bits, masks, shifts or group indices all change the result.
_MUTANT_CASE = (mx.float32, 128, 8, 8, 2, None, False, (8, 4, 64))

# name -> (variant, kind, text, replacement); `text` must occur exactly once in the body.
MUTANTS = {
    "qv1-key-shift-of-values": ("v1", "qv1", "(kw[i * KBITS] >> kshift)",
                                "(kw[i * KBITS] >> vshift)"),
    "qv1-key-word-without-lane": ("v1", "qv1", "+ lane * KBITS / 32;", ";"),
    "qv1-key-group-index": ("v1", "qv1", "float(ksc[i * 32 / GS])", "float(ksc[i])"),
    "qv1-key-missing-bias": ("v1", "qv1", " + float(kbi[i * 32 / GS]))", ")"),
    "qv2-value-mask-of-keys": ("v2", "qv2", "& VMASK)", "& KMASK)"),
    "qv2-value-scales-of-keys": ("v2", "qv2", "float(vsc[i * 32 / GS])",
                                 "float(ksc[i * 32 / GS])"),
    "qv2-value-word-stride": ("v2", "qv2", "vw[i * VBITS]", "vw[i * KBITS]"),
}


def mutant_sources(name: str) -> dict[str, str]:
    _, kind, text, replacement = MUTANTS[name]
    assert SOURCES[kind].count(text) == 1, f"mutation site of {name} not unique/found"
    return {kind: SOURCES[kind].replace(text, replacement)}


def _emulate(case, variant, sources=None, capture_only=False, small=True):
    kwargs = {"v1_simdgroups": 4} if small else {}
    with pytest.MonkeyPatch.context() as mp:
        if small:
            mp.setattr(_common, "PARTITION_SIZE", 16)
        return H.emulate_decode(case.q, case.kv, variant=variant, sources=sources,
                                capture_only=capture_only, **kwargs)


def check(case: _cases.Case, out: mx.array, dtype: mx.Dtype) -> str | None:
    return _cases.mismatch(out, H.reference_f32(case), case.kv.context_lens, TOL[dtype], TOL[dtype])


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    """Compile every source this module runs, in parallel, before the first test."""
    srcs = []
    for inst in INSTANCES:
        for variant in ("v1", "v2"):
            srcs += _emulate(_case(inst), variant, capture_only=True)
    for variant in ("v1", "v2"):
        srcs += _emulate(_prod_case(), variant, capture_only=True, small=False)
        srcs += _emulate(_case(_MUTANT_CASE), variant, capture_only=True)
    for name, (variant, *_) in MUTANTS.items():
        srcs += _emulate(_case(_MUTANT_CASE), variant, mutant_sources(name), capture_only=True)
    H.prebuild(srcs)


def test_quantized_kinds_are_launched():
    case = _case(INSTANCES[2])
    shape = _common.decode_shape(case.q, case.kv)
    assert shape.quant == (8, 4, 64)
    assert [ln.kind for ln in _common.plan(shape, "v2")] == ["qv2", "reduce"]
    assert dict(_common.plan(shape, "v1")[0].template)["VBITS"] == 4


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("inst", INSTANCES, ids=_id)
def test_quantized_decode_matches_reference(inst, variant):
    case = _case(inst)
    out = _emulate(case, variant)
    assert out.dtype == inst[0] and out.shape == case.q.shape
    assert np.all(np.array(out[0].astype(mx.float32)) == 0)   # row 0 has no keys
    assert check(case, out, inst[0]) is None


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_production_sizes(variant):
    """32 simdgroups per v1 threadgroup; 512-token v2 partitions (a 1100-key row spans
    three)."""
    case = _prod_case()
    assert check(case, _emulate(case, variant, small=False), mx.bfloat16) is None


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_unmutated_passes(variant):
    case = _case(_MUTANT_CASE)
    assert check(case, _emulate(case, variant), mx.float32) is None


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught(name):
    case = _case(_MUTANT_CASE)
    out = _emulate(case, MUTANTS[name][0], mutant_sources(name))
    assert check(case, out, mx.float32) is not None, f"mutant {name} passed"
