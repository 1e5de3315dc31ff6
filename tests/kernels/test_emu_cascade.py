"""Cascade attention's own-keys part on the Metal kernels (``v1_lse``, ``qv1_lse``, ``v2`` /
``qv2`` + ``reduce_lse``), run on the CPU in ``tests/tools/msl_emu``: rows whose keys start at
a block offset (after a group's shared prefix), with windows on full and trimmed tables, over
float and quantized pools, against the float32 reference's output and log-sum-exp
(``cascade_reference.paged_attention_lse``); the whole cascade (the emulated part merged with the
reference's shared part) against the plain reference; and planted bugs in the new code must be
caught.

Tolerance ``1e-5 + 1e-5 * |ref|`` for every dtype: the inputs are exact in float32 and the
``_lse`` twins write their output in float32 (not rounded to ``T``), so only the order of the
float32 sums differs. Tests run 4 simdgroups per v1 threadgroup and 16-token v2 partitions.
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_data"))
import emu_harness as H  # noqa: E402

from mlxpa.kernels import _cases, _common, cascade_reference, reference  # noqa: E402
from mlxpa.kernels.paged_attention_source import SOURCES  # noqa: E402

pytestmark = [pytest.mark.slow,  # the emulator's C++ builds
              pytest.mark.skipif(H.unavailable_reason() is not None,
                                 reason=str(H.unavailable_reason()))]

TOL = 1e-5

# (dtype, head_dim, block_size, q_heads, kv_heads, window, trim, quant)
INSTANCES = [
    (mx.float32, 64, 8, 8, 2, None, False, None),
    (mx.bfloat16, 128, 16, 4, 1, 20, True, None),
    (mx.float16, 64, 16, 4, 4, 40, False, (8, 4, 32)),
    (mx.float32, 128, 8, 8, 1, None, False, (4, 4, 64)),
]


def _id(inst) -> str:
    dtype, d, bs, hq, hkv, window, trim, quant = inst
    pools = "" if quant is None else "-k{}v{}g{}".format(*quant)
    return (f"{str(dtype).split('.')[-1]}-d{d}-bs{bs}-g{hq // hkv}-w{window or 0}"
            f"{'t' if trim else ''}{pools}")


def _case(inst, seed: int = 1) -> _cases.Case:
    dtype, d, bs, hq, hkv, window, trim, quant = inst
    # Rows without keys, of one key, and own parts after 1-3 shared blocks.
    lens = [0, 1, bs + 1, 3 * bs + 5, 2 * bs, 4 * bs - 1]
    return H.make_case(seed, dtype, d, bs, hq, hkv, lens, window, trim, quant=quant,
                       skip_blocks=[0, 0, 1, 2, 1, 3])


def _emulate(case, variant, sources=None, capture_only=False):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_common, "PARTITION_SIZE", 16)
        return H.emulate_decode(case.q, case.kv, variant=variant, v1_simdgroups=4,
                                sources=sources, capture_only=capture_only, lse=True)


def _check(case, got) -> str | None:
    return _cases.lse_mismatch(got, H.reference_f32(case, lse=True), case.kv.context_lens, TOL, TOL)


_MUTANT_CASE = (mx.bfloat16, 64, 8, 8, 2, None, False, None)

# name -> (variant, kind, text, replacement); `text` must occur exactly once in the body.
MUTANTS = {
    "v1_lse-without-max": ("v1", "v1_lse", "gm + metal::log(gl)", "metal::log(gl)"),
    "reduce_lse-without-max": ("v2", "reduce_lse", "gm + metal::log(gl)", "metal::log(gl)"),
    "v1_lse-output-rounded-to-T": ("v1", "v1_lse", "op[c * CH + tid] = o * inv;",
                                   "op[c * CH + tid] = float(static_cast<T>(o * inv));"),
    "reduce_lse-output-rounded-to-T": ("v2", "reduce_lse", "= gl > 0.0f ? o / gl : 0.0f;",
                                       "= float(static_cast<T>(gl > 0.0f ? o / gl : 0.0f));"),
    "v1_lse-key-offset-ignored": ("v1", "v1_lse", "const int ks = key_start[b];",
                                  "const int ks = 0;"),
    "reduce_lse-head-index": ("v2", "reduce_lse", "lse[int64_t(b) * HQ + hq]",
                              "lse[int64_t(b) * HQ]"),
}


def mutant_sources(name: str) -> dict[str, str]:
    _, kind, text, replacement = MUTANTS[name]
    assert SOURCES[kind].count(text) == 1, f"mutation site of {name} not unique/found"
    return {kind: SOURCES[kind].replace(text, replacement)}


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    """Compile every source this module runs, in parallel, before the first test."""
    srcs = []
    for inst in [*INSTANCES, _MUTANT_CASE]:
        for variant in ("v1", "v2"):
            srcs += _emulate(_case(inst), variant, capture_only=True)
    for name, (variant, *_) in MUTANTS.items():
        srcs += _emulate(_case(_MUTANT_CASE), variant, mutant_sources(name), capture_only=True)
    H.prebuild(srcs)


def test_lse_kinds_are_launched():
    case = _case(INSTANCES[2])
    shape = _common.decode_shape(case.q, case.kv)
    assert [ln.kind for ln in _common.plan(shape, "v1", lse=True)] == ["qv1_lse"]
    launches = _common.plan(shape, "v2", lse=True)
    assert [ln.kind for ln in launches] == ["qv2", "reduce_lse"]
    assert launches[-1].output_dtypes == (mx.float32, mx.float32)
    assert launches[-1].output_shapes[1] == (shape.batch, shape.q_heads)


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("inst", INSTANCES, ids=_id)
def test_own_keys_part_matches_reference(inst, variant):
    case = _case(inst)
    out, lse = _emulate(case, variant)
    assert out.dtype == mx.float32 and out.shape == case.q.shape
    assert lse.shape == (*case.q.shape[:2], 1)
    assert np.all(np.array(out[0]) == 0)                  # row 0 has no keys
    assert _check(case, (out, lse)) is None


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_cascade_with_the_emulated_part_equals_plain_attention(variant):
    """Rows 2..5 made to share their first block (row 5's): the emulated own-keys part of
    each row merged with the reference's shared part equals plain attention."""
    bs, group = 8, [2, 3, 4, 5]
    q, kv = _cases.random_case(
        4, mx.float32, 64, bs, 8, 2, [0, 1, bs + 1, 3 * bs + 5, 2 * bs, 4 * bs - 1])
    full = np.array(kv.block_tables)
    full[group, 0] = full[5, 0]
    plain = reference.paged_attention(q, kv._replace(block_tables=mx.array(full)))
    prefix = cascade_reference.CascadePrefix(
        mx.array(full[5:, :1]), mx.array([0], mx.int32), mx.array([bs], mx.int32),
        mx.array([group], mx.int32), mx.array([4, 4, 0, 1, 2, 3], mx.int32))
    own = full.copy()
    own[group, :-1] = full[group, 1:]
    key_start = mx.array([bs if r in group else 0 for r in range(6)], mx.int32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_common, "PARTITION_SIZE", 16)
        part = H.emulate_decode(q, kv._replace(block_tables=mx.array(own), key_start=key_start),
                                variant=variant, v1_simdgroups=4, lse=True)
    got = cascade_reference.cascade_merge(q, kv, prefix, *part)
    assert _cases.mismatch(got, plain, kv.context_lens, 1e-5, 1e-5) is None


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_unmutated_passes(variant):
    case = _case(_MUTANT_CASE)
    assert _check(case, _emulate(case, variant)) is None


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_is_caught(name):
    case = _case(_MUTANT_CASE)
    got = _emulate(case, MUTANTS[name][0], mutant_sources(name))
    assert _check(case, got) is not None, f"mutant {name} passed"
