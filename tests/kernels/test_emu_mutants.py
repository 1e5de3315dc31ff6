"""Planted bugs must be caught: each mutant of a Metal kernel body (wrong KV-head mapping,
missing barrier, off-by-one context length, missing softmax rescale) runs in the emulator on a
GQA case (8 query heads over 2 KV heads, ragged rows up to 70 keys) and must fail the
comparison with the reference that the unmutated body passes.
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_data"))
import emu_harness as H  # noqa: E402

from mlxpa.kernels import _cases, _common  # noqa: E402
from mlxpa.kernels.metal_paged_attention import SOURCES  # noqa: E402

pytestmark = [pytest.mark.slow,  # the emulator's C++ builds
              pytest.mark.skipif(H.unavailable_reason() is not None,
                                 reason=str(H.unavailable_reason()))]

BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);\n"

# name -> (variant, kind, text, replacement); `text` must occur exactly once in the body.
MUTANTS = {
    "v1-kv-head-mapping": ("v1", "v1", "hkv = hq / (HQ / HKV);", "hkv = hq % HKV;"),
    "v2-q-head-mapping": ("v2", "v2", "HQ + hkv * G + g) * D", "HQ + g * HKV + hkv) * D"),
    "v1-missing-barrier": ("v1", "v1", "    }\n    " + BARRIER + "    float gm",
                           "    }\n    float gm"),
    "v2-missing-barrier": ("v2", "v2", "      " + BARRIER + "      const int64_t r",
                           "      const int64_t r"),
    "v1-context-off-by-one": ("v1", "v1", "min(context_lens[b],", "min(context_lens[b] - 1,"),
    "v2-context-off-by-one": ("v2", "v2", "min(context_lens[b],", "min(context_lens[b] - 1,"),
    "v1-loop-off-by-one": ("v1", "v1", "pos < hi; pos += NSG", "pos <= hi; pos += NSG"),
    "v1-missing-rescale": ("v1", "v1", "acc[i] = acc[i] * alpha +", "acc[i] = acc[i] +"),
    "v2-missing-rescale": ("v2", "v2", "acc[g][i] = acc[g][i] * alpha +",
                           "acc[g][i] = acc[g][i] +"),
    "v1-missing-merge-rescale": ("v1", "v1", "f = metal::exp(m - gm);", "f = 1.0f;"),
    "reduce-missing-rescale": ("v2", "reduce", "D + d] * w;", "D + d];"),
}


def mutant_sources(name: str) -> dict[str, str]:
    _, kind, text, replacement = MUTANTS[name]
    assert SOURCES[kind].count(text) == 1, f"mutation site of {name} not unique/found"
    return {kind: SOURCES[kind].replace(text, replacement)}


def _case() -> _cases.Case:
    return H.make_case(5, mx.float32, 64, 8, 8, 2, [0, 1, 7, 9, 70])


def _run(variant: str, sources=None, capture_only=False):
    case = _case()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_common, "PARTITION_SIZE", 16)
        out = H.emulate_decode(case.q, case.kv, variant=variant, v1_simdgroups=4,
                               sources=sources, capture_only=capture_only)
    return case, out


def _mismatch(case, out):
    return _cases.mismatch(out, H.reference_f32(case), case.kv.context_lens, 1e-5, 1e-5)


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    srcs = _run("v1", capture_only=True)[1] + _run("v2", capture_only=True)[1]
    for name, (variant, *_) in MUTANTS.items():
        srcs += _run(variant, mutant_sources(name), capture_only=True)[1]
    H.prebuild(srcs)


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_unmutated_passes(variant):
    case, out = _run(variant)
    assert _mismatch(case, out) is None


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught(name):
    variant = MUTANTS[name][0]
    # A missing barrier is a race: it fails when a simdgroup reads before another has
    # written, which on the emulator (threads started one after another, simdgroups with
    # different key counts) happens on nearly every run; three runs make a miss negligible.
    tries = 3 if "barrier" in name else 1
    results = []
    for _ in range(tries):
        case, out = _run(variant, mutant_sources(name))
        results.append(_mismatch(case, out))
        if results[-1] is not None:
            break
    assert results[-1] is not None, f"mutant {name} passed the reference comparison"
