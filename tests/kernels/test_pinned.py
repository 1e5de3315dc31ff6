"""The exact Metal source MLX generates for the paged-attention kernels is pinned per template
instance (``tests/kernels/kernels_data/pinned/*.metal``), so an unintended change to a kernel
body, to the launch plan or to MLX's code generation shows up in review.

The source is captured by tracing the call inside ``mx.export_function`` with verbose=True
(no Metal needed). Inputs are a batch of 8 rows, so per-row inputs take the ``device``
address space (MLX puts inputs under 8 elements in ``constant``). After an intended change:
``MLXPA_UPDATE_PINNED=1 pytest tests/kernels/test_pinned.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
import sys

import mlx.core as mx
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "kernels_data"))
import emu_harness as H  # noqa: E402

from mlxpa.kernels import _cases, _common  # noqa: E402

PINNED_DIR = os.path.join(_HERE, "kernels_data", "pinned")

pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(H.EMU_DIR, "msl_run.py")),
    reason=f"msl_emu (source capture) not found at {H.EMU_DIR}")

# (dtype, head_dim, block_size, window, q_heads, kv_heads, quantized pools as (kbits, vbits,
# group_size) or None); Gemma 3 270M's global and local layers in bfloat16, float and int8 /
# int4, and k8v4.
INSTANCES = [
    (dtype, d, bs, w, 8, 2, None)
    for dtype in (mx.float32, mx.float16, mx.bfloat16)
    for d, bs, w in ((64, 8, 0), (128, 16, 512), (256, 32, 0))
] + [(mx.bfloat16, 256, 16, 0, 4, 1, None), (mx.bfloat16, 256, 16, 512, 4, 1, None),
     (mx.bfloat16, 256, 16, 0, 4, 1, (8, 8, 64)), (mx.bfloat16, 256, 16, 512, 4, 1, (4, 4, 64)),
     (mx.float16, 128, 16, 0, 8, 2, (8, 4, 64)), (mx.float32, 64, 8, 0, 8, 2, (8, 8, 32))]
# Cascade attention's own-keys twins (v1_lse, reduce_lse; v2 is pinned above), pinned as
# "<instance>_lse": Gemma 3 270M's layers in bfloat16, float and int4.
LSE_INSTANCES = [(mx.bfloat16, 256, 16, 0, 4, 1, None), (mx.bfloat16, 256, 16, 512, 4, 1, None),
                 (mx.bfloat16, 256, 16, 512, 4, 1, (4, 4, 64))]
ALL = [(inst, False) for inst in INSTANCES] + [(inst, True) for inst in LSE_INSTANCES]


def _name(inst, lse: bool = False) -> str:
    dtype, d, bs, w, hq, hkv, quant = inst
    pools = "" if quant is None else "_k{}v{}g{}".format(*quant)
    return f"{str(dtype).split('.')[-1]}_d{d}_bs{bs}_w{w}_h{hq}x{hkv}{pools}" + (
        "_lse" if lse else "")


def generated(inst, lse: bool = False) -> str:
    """v1, v2 and reduce sources of one instance, as one text (``lse``: v1_lse and
    reduce_lse)."""
    dtype, d, bs, w, hq, hkv, quant = inst
    case = _cases.random_case(0, dtype, d, bs, hq, hkv, [1, 9, 600, 0, 33, 17, 2, 70],
                              window=w or None, quant=quant)
    parts = {}
    for variant in ("v1", "v2"):
        srcs = H.emulate_decode(case.q, case.kv, variant=variant, capture_only=True, lse=lse)
        shape = _common.decode_shape(case.q, case.kv)
        kinds = [ln.kind for ln in _common.plan(shape, variant, lse=lse)]
        parts.update(zip((k.removeprefix("q") for k in kinds), srcs))  # v1 for qv1 too
    if lse:
        parts = {k: v for k, v in parts.items() if k.endswith("_lse")}
    return "".join(f"// ==== {kind} ====\n{src}" for kind, src in parts.items())


@pytest.mark.parametrize("inst,lse", ALL, ids=[_name(*a) for a in ALL])
def test_generated_metal_source_is_pinned(inst, lse):
    path = os.path.join(PINNED_DIR, _name(inst, lse) + ".metal")
    text = generated(inst, lse)
    if os.environ.get("MLXPA_UPDATE_PINNED"):
        os.makedirs(PINNED_DIR, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    assert os.path.isfile(path), f"{path} missing; run with MLXPA_UPDATE_PINNED=1"
    with open(path) as f:
        pinned = f.read()
    diff = "".join(list(difflib.unified_diff(pinned.splitlines(True), text.splitlines(True),
                                             "pinned", "generated"))[:40])
    assert text == pinned, f"generated Metal source changed ({_name(inst, lse)}):\n{diff}"


def test_pinned_sources_are_all_current():
    """No stale pinned file for an instance the test no longer generates."""
    names = {_name(*a) + ".metal" for a in ALL}
    assert set(os.listdir(PINNED_DIR)) <= names
