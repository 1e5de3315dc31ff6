"""The CUDA twin of the paged-attention kernels.

- On any machine with ``nvcc``: the source MLX's CUDA back end generates (reproduced by
  ``cuda_paged_attention.generated_source``) compiles for sm_90a in all three dtypes with no
  register spills, no stack frame, registers that fit the launch's block size, and static
  shared memory under 48 KB. Instances: head_dim 256 with an 8-way GQA group (the most
  accumulators per lane v2 accepts) and head_dim 64, over float pools and over quantized
  ones (``qv1``/``qv2``: k8v4 with groups of 64, int4 with groups of 32); every kind,
  cascade attention's ``_lse`` twins included.
- On a CUDA GPU (MLX's CUDA build): both variants match the reference, and the ``_lse``
  twins (keys from a block offset) the reference's output and log-sum-exp.
- Without CUDA: constructing a ``cuda_kernel`` raises, and importing the module does not.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import _cases, _common, cuda_paged_attention

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# head_dim, block_size, window, hq, hkv, quantized pools (kbits, vbits, group_size) or None
SHAPES = [(256, 16, 512, 8, 1, None), (64, 8, 0, 4, 2, None), (256, 16, 512, 8, 1, (8, 4, 64)),
          (64, 8, 0, 4, 2, (4, 4, 32))]
NVCC = shutil.which("nvcc")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_data"))
try:
    import emu_harness as EMU
except ImportError:  # pragma: no cover
    EMU = None


def _launches(dtype, d, bs, window, hq, hkv, quant=None):
    shape = _common.DecodeShape(8, hq, hkv, d, bs, 64, window, dtype, *(quant or (0, 0, 0)))
    return _gpu_check().all_launches(shape)


def ptxas_report(stderr: str) -> dict[str, dict[str, int]]:
    """Per kernel kind (name substring ``mlxpa_paged_<kind>_``): registers,
    spill stores/loads, stack frame and static shared memory bytes from ``ptxas -v``."""
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = report.setdefault(_gpu_check().kernel_kind(m.group(1)), {})
        elif current is not None and (m := re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                line)):
            current.update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current["registers"] = int(m[1])
            smem = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(smem[1]) if smem else 0
    return report


def _compile(dtype_name: str, shape) -> tuple[str, dict]:
    launches = _launches(DTYPES[dtype_name], *shape)
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cu")
        with open(cu, "w") as f:
            f.write("\n".join(cuda_paged_attention.generated_source(ln) for ln in launches))
        r = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o",
                            os.path.join(tmp, "k.cubin"), cu], capture_output=True, text=True)
    return (r.stderr if r.returncode else ""), ptxas_report(r.stderr)


@pytest.fixture(scope="module")
def nvcc_results():
    jobs = [(n, s) for n in DTYPES for s in SHAPES]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return dict(zip(jobs, pool.map(lambda j: _compile(*j), jobs)))


@pytest.mark.slow  # nvcc builds
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}-g{s[3] // s[4]}" + (
    "-k{}v{}g{}".format(*s[5]) if s[5] else ""))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_nvcc_sm90a_no_spills(nvcc_results, dtype_name, shape):
    error, report = nvcc_results[(dtype_name, shape)]
    assert not error, error[-3000:]
    threads = {ln.kind: ln.threadgroup[0] for ln in _launches(DTYPES[dtype_name], *shape)}
    kinds = {"v1", "v2", "reduce", "v1_lse", "reduce_lse"}
    assert set(report) == ({"q" + k if "v" in k[:2] else k for k in kinds} if shape[5] else kinds)
    for kind, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (kind, r)
        assert r["stack"] == 0, (kind, r)                  # no local-memory arrays
        assert r["registers"] * threads[kind] <= 65536, (kind, r)
        assert r["smem"] <= 48 * 1024, (kind, r)


@pytest.mark.skipif(mx.cuda.is_available(), reason="this MLX build has CUDA")
def test_cuda_kernel_is_built_lazily():
    cuda_paged_attention.kernel.cache_clear()
    with pytest.raises(RuntimeError):
        cuda_paged_attention.kernel("v1")


@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX with a CUDA GPU")
@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("d,bs,hq,hkv,window,quant", [
    (64, 8, 4, 4, None, None), (128, 16, 8, 2, 20, None), (256, 32, 8, 1, None, None),
    (256, 16, 4, 1, 512, None), (256, 16, 4, 1, 512, (8, 8, 64)), (128, 16, 8, 2, 20, (4, 4, 32)),
    (64, 8, 4, 4, None, (8, 4, 64))])
def test_cuda_matches_reference(dtype, variant, d, bs, hq, hkv, window, quant):
    tol = {mx.float32: 1e-4, mx.float16: 2e-3, mx.bfloat16: 4e-3}[dtype]
    case = _cases.random_case(0, dtype, d, bs, hq, hkv, [0, 1, bs - 1, bs + 1, 700, 1500],
                              window, trim=window is not None, quant=quant)
    out = cuda_paged_attention.paged_attention(case.q, case.kv, variant=variant)
    why = _cases.mismatch(out, _cases.reference_f32(case), case.kv.context_lens, tol, tol)
    assert why is None, why
    own = _cases.random_case(1, dtype, d, bs, hq, hkv, [0, 1, bs - 1, bs + 1, 700, 1500],
                             window, trim=window is not None, quant=quant,
                             skip_blocks=[0, 0, 0, 1, 3, 2])
    got = cuda_paged_attention.paged_attention(own.q, own.kv, variant=variant, lse=True)
    why = _cases.lse_mismatch(got, _cases.reference_f32(own, lse=True), own.kv.context_lens,
                              1e-4, 1e-4)
    assert why is None, why


@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX with a CUDA GPU")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_cascade_attention_on_cuda_matches_reference(dtype):
    """The dispatcher's CUDA cascade path (the _lse twins for each row's own keys, MLX ops
    for the shared prefix) against the reference cascade on the CPU."""
    import mlxpa.kernels as K
    from mlxpa.kernels import cascade_reference
    from tests.kernels.test_cascade import make_case

    case = make_case(np.random.default_rng(3), [(40, [1, 9, 20, 33]), (3, [5, 16])], [7, 300],
                     kv_heads=2, q_per_kv=4, head_dim=128, block_size=16, window=None)
    c = case["cascade"]
    q = mx.array(case["q"].astype(np.float32)).astype(dtype)
    kv = K.PagedKV(case["kc"].astype(dtype), case["vc"].astype(dtype), c.block_tables,
                   mx.array(np.array(case["ctx"], np.int32)), mx.array(case["starts"]), 0.088,
                   key_start=c.key_start)
    got = K.cascade_attention(q, kv, c.prefix, kernel="cuda")
    with mx.stream(mx.cpu):
        want = cascade_reference.cascade_attention(
            q.astype(mx.float32), kv._replace(key_cache=kv.key_cache.astype(mx.float32),
                                              value_cache=kv.value_cache.astype(mx.float32)),
            c.prefix)
    tol = 1e-4 if dtype == mx.float32 else 4e-3
    assert _cases.mismatch(got, want, kv.context_lens, tol, tol) is None


def _gpu_check():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                        "gpu_check.py")
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # an nvcc build
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_gpu_check_builds_without_mlx():
    """scripts/gpu_check.py loads the kernel modules through its stand-in for mlx.core (as on a
    GPU machine without MLX) and compiles the instances of its --quick run."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "gpu_check.py")
    env = dict(os.environ, MLXPA_GPU_CHECK_STUB_MLX="1")
    r = subprocess.run([sys.executable, script, "--build-only", "--quick"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "built 6 instances" in r.stdout  # 5 float, 1 over quantized pools; all kinds each


def test_gpu_check_reference_matches_mlxpa_reference():
    from mlxpa.kernels import PagedKV, reference

    g = _gpu_check()
    inst = ("bfloat16", 64, 8, 4, 2, 6)
    case = g.make_case(np.random.default_rng(0), inst, [0, 1, 7, 9, 40], trim=True)
    want = g.reference_f64(case, inst)
    f = {k: mx.array(case[k][1]) for k in ("q", "kc", "vc")}
    out = reference.paged_attention(f["q"][:, :, None], PagedKV(
        f["kc"], f["vc"], mx.array(case["table"]), mx.array(case["lens"]),
        mx.array(case["qstart"]), case["scale"], sliding_window=6,
        key_start=mx.array(case["kstart"])))
    assert np.allclose(np.array(out)[1:, :, 0], want[1:], atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # an emulator build
@pytest.mark.skipif(EMU is None or EMU.unavailable_reason() is not None,
                    reason="msl_emu or g++ unavailable")
@pytest.mark.parametrize("quant", [None, (8, 4, 32)], ids=["float", "k8v4"])
def test_gpu_check_launch_path_in_emulator(quant):
    """gpu_check's case (its own quantizer for quantized pools), launch chain (argument order,
    grids, meta) and float64 check (output, and the ``_lse`` twins' log-sum-exp), with numpy
    for CuPy and the emulated Metal body for each cubin kernel."""
    g = _gpu_check()
    inst = ("bfloat16", 64, 8, 2, 1, None)
    dt = mx.bfloat16

    def launcher(kind):
        shape = _common.DecodeShape(1, 2, 1, 64, 8, 4, 0, dt, *(quant or (0, 0, 0)))
        launch = {ln.kind: ln for ln in g.all_launches(shape)}[kind]
        n_out = len(launch.output_shapes)

        def fn(grid, block, args):
            ins = [EMU.from_numpy(a, dt) if a.dtype == np.uint16 else mx.array(a)
                   for a in args[:-n_out]]
            src = EMU.capture(kind, launch, ins)
            lib, nbuf = EMU.compile_source(src)
            assert nbuf == len(args)
            ptrs = (ctypes.c_void_p * nbuf)(*[a.ctypes.data for a in args])
            lib.run(ptrs, *(gd * b for gd, b in zip(grid, block)), *block)

        return fn

    kinds = ("v1", "v2", "reduce", "v1_lse", "reduce_lse")
    fns = {k: launcher(k) for k in (("q" + k if k[0] == "v" else k) if quant else k
                                    for k in kinds)}
    for variant in ("v1", "v2"):
        for lse in (False, True):
            assert g.check_case(np, fns, inst, 0, variant, quant=quant, lse=lse) is None
