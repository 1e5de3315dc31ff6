"""The Metal paged-attention kernels, run on the CPU with ``tests/tools/msl_emu``, against the
reference: ragged lengths (0, 1, block size +- 1, longer), GQA ratios 1/4/8, windows with and
without trimmed tables, all three dtypes, both decode variants.

Tolerance: ``|out - ref| <= tol + tol * |ref|`` with tol 1e-5 (float32) / 2e-3 (float16,
bfloat16; the output's own rounding is below 2e-3 relative). Rows without keys must be zeros.
Most cases run 4 simdgroups per v1 threadgroup and 16-token v2 partitions (the emulator runs
one CPU thread per GPU thread); two cases run the production 32 simdgroups and 512-token
partitions. ``MLXPA_KERNEL_SWEEP=1`` adds a larger random sweep.
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

pytestmark = [pytest.mark.slow,  # the emulator's C++ builds
              pytest.mark.skipif(H.unavailable_reason() is not None,
                                 reason=str(H.unavailable_reason()))]

TOL = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-3}

# (dtype, head_dim, block_size, q_heads, kv_heads, window, trim): every dtype, head dim,
# block size and GQA ratio (1, 4, 8) at least once; windows on full and trimmed tables.
INSTANCES = [
    (mx.float32, 64, 8, 2, 2, None, False),
    (mx.float16, 128, 16, 8, 2, 20, True),
    (mx.bfloat16, 256, 32, 8, 1, None, False),
    (mx.float32, 128, 32, 8, 1, 24, False),
    (mx.bfloat16, 64, 16, 4, 4, 5, True),
    (mx.float16, 256, 8, 4, 1, None, False),
]


def _id(inst) -> str:
    dtype, d, bs, hq, hkv, window, trim = inst
    name = str(dtype).split(".")[-1]
    return f"{name}-d{d}-bs{bs}-g{hq // hkv}-w{window or 0}{'t' if trim else ''}"


def lens_for(block_size: int) -> list[int]:
    return [0, 1, block_size - 1, block_size + 1, 3 * block_size + 5]


def check(case: _cases.Case, out: mx.array, dtype: mx.Dtype) -> None:
    ref = H.reference_f32(case)
    why = _cases.mismatch(out, ref, case.kv.context_lens, TOL[dtype], TOL[dtype])
    assert why is None, why


def _param_case(inst) -> _cases.Case:
    dtype, d, bs, hq, hkv, window, trim = inst
    return H.make_case(1, dtype, d, bs, hq, hkv, lens_for(bs), window, trim)


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    """Compile every source this module runs, in parallel, before the first test."""
    srcs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_common, "PARTITION_SIZE", 16)
        for inst in INSTANCES:
            case = _param_case(inst)
            for variant in ("v1", "v2"):
                srcs += H.emulate_decode(case.q, case.kv, variant=variant,
                                         v1_simdgroups=4, capture_only=True)
    for case, variant in ((_prod_v1_case(), "v1"), (_prod_v2_case(), "v2")):
        srcs += H.emulate_decode(case.q, case.kv, variant=variant, capture_only=True)
    H.prebuild(srcs)


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("inst", INSTANCES, ids=_id)
def test_decode_matches_reference(inst, variant, monkeypatch):
    monkeypatch.setattr(_common, "PARTITION_SIZE", 16)  # several partitions, some empty
    case = _param_case(inst)
    out = H.emulate_decode(case.q, case.kv, variant=variant, v1_simdgroups=4)
    assert out.dtype == inst[0] and out.shape == case.q.shape
    # Row 0 has no keys: exact zeros, no NaN (``mismatch`` checks it too).
    assert np.all(np.array(out[0].astype(mx.float32)) == 0)
    check(case, out, inst[0])


def _prod_v1_case() -> _cases.Case:
    return H.make_case(2, mx.bfloat16, 64, 16, 2, 1, [0, 17, 40])


def _prod_v2_case() -> _cases.Case:
    return H.make_case(3, mx.float16, 64, 32, 4, 2, [1, 1100, 530])


def test_v1_production_simdgroups():
    """32 simdgroups (1024 threads) per threadgroup, as on the GPU."""
    case = _prod_v1_case()
    check(case, H.emulate_decode(case.q, case.kv, variant="v1"), mx.bfloat16)


def test_v2_production_partitions():
    """512-token partitions: a 1100-key row spans three, short rows leave partitions empty."""
    case = _prod_v2_case()
    shape = _common.decode_shape(case.q, case.kv)
    assert shape.num_partitions == 3
    check(case, H.emulate_decode(case.q, case.kv, variant="v2"), mx.float16)


@pytest.mark.skipif(not os.environ.get("MLXPA_KERNEL_SWEEP"),
                    reason="set MLXPA_KERNEL_SWEEP=1 for the larger random sweep")
@pytest.mark.parametrize("seed", range(12))
def test_random_sweep(seed, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    dtype = [mx.float32, mx.float16, mx.bfloat16][seed % 3]
    d, bs = int(rng.choice([64, 128, 256])), int(rng.choice([8, 16, 32]))
    hkv = int(rng.choice([1, 2]))
    hq = hkv * int(rng.choice([1, 4, 8]))
    window = [None, int(rng.integers(1, 80))][seed % 2]
    lens = rng.integers(0, 150, size=int(rng.integers(1, 6))).tolist()
    monkeypatch.setattr(_common, "PARTITION_SIZE", int(rng.choice([16, 64])))
    case = H.make_case(seed, dtype, d, bs, hq, hkv, lens, window, trim=bool(seed % 4 == 1))
    for variant in ("v1", "v2"):
        out = H.emulate_decode(case.q, case.kv, variant=variant, v1_simdgroups=4)
        check(case, out, dtype)
