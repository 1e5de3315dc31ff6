"""Run mlxpa's Metal paged-attention kernels on a Linux CPU with ``tests/tools/msl_emu``.

The exact Metal source MLX generates for each launch is captured by tracing the call inside
``mx.export_function`` (``msl_run.generated_msl``), compiled as C++20 against ``msl_emu.h``
(cached per source hash for the session) and called through ctypes with numpy buffers. Outputs
start as NaN, so an element a kernel forgets to write fails every comparison.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from mlxpa.kernels import _cases, _common, metal_paged_attention
from mlxpa.kernels.paged_kv import PagedKV

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))
# The emulator: the repository's own (tests/tools/msl_emu), or $MLXPA_MSL_EMU.
EMU_DIR = os.environ.get("MLXPA_MSL_EMU") or os.path.join(_ROOT, "tests", "tools", "msl_emu")


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here, or None."""
    if not os.path.isfile(os.path.join(EMU_DIR, "msl_run.py")):
        return f"msl_emu not found at {EMU_DIR} (set MLXPA_MSL_EMU)"
    if shutil.which("g++") is None:
        return "g++ not found"
    return None


def _msl_run():
    if EMU_DIR not in sys.path:
        sys.path.insert(0, EMU_DIR)
    import msl_run

    return msl_run


_CACHE_DIR = tempfile.mkdtemp(prefix="mlxpa_msl_emu_")
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
_LIBS: dict[str, tuple[ctypes.CDLL, int]] = {}
_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def capture(kind: str, launch: _common.Launch, inputs: list[mx.array],
            source: str | None = None) -> str:
    """The Metal source MLX generates for ``launch`` with these inputs (dtypes and sizes
    decide the signature: inputs under 8 elements go to the ``constant`` address space)."""
    kern = metal_paged_attention.build_kernel(kind, source)

    def call(*args):
        return kern(inputs=list(args), template=list(launch.template), grid=launch.grid,
                    threadgroup=launch.threadgroup, output_shapes=list(launch.output_shapes),
                    output_dtypes=list(launch.output_dtypes), verbose=True)

    return _msl_run().generated_msl(call, *inputs)


def _precompile_header() -> None:
    """Copy msl_emu.h next to the generated .cpp files with a precompiled ``.gch`` (the
    quoted include finds it first): halves each compile. With flags other than
    ``msl_run.build``'s, g++ ignores the .gch and reads the identical header copy."""
    with _GUARD:
        header = os.path.join(_CACHE_DIR, "msl_emu.h")
        if os.path.exists(header):
            return
        shutil.copy(os.path.join(EMU_DIR, "msl_emu.h"), header + ".tmp")
        subprocess.run(["g++", *_msl_run().CXXFLAGS, "-x", "c++-header", header + ".tmp",
                        "-o", header + ".gch"],
                       capture_output=True, check=False)
        os.replace(header + ".tmp", header)


def compile_source(src: str) -> tuple[ctypes.CDLL, int]:
    """Compile (once per session and source) and load; returns (library, buffer count)."""
    _precompile_header()
    key = hashlib.sha1(src.encode()).hexdigest()[:16]
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _LIBS:
            so = os.path.join(_CACHE_DIR, f"k_{key}.so")
            nbuf = _msl_run().build(src, so)
            lib = ctypes.CDLL(so)
            lib.run.restype = None
            lib.run.argtypes = [ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_uint] * 6
            _LIBS[key] = (lib, nbuf)
        return _LIBS[key]


def to_numpy(a: mx.array) -> np.ndarray:
    """Contiguous numpy copy; bfloat16 as its uint16 bits."""
    if a.dtype == mx.bfloat16:
        return np.ascontiguousarray(np.array(a.view(mx.uint16)))
    return np.ascontiguousarray(np.array(a))


def from_numpy(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    if dtype == mx.bfloat16:
        return mx.array(a).view(mx.bfloat16)
    return mx.array(a)


_NP = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16}


def run_launch(src: str, launch: _common.Launch, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run one compiled launch on numpy inputs; returns the outputs (NaN where unwritten)."""
    lib, nbuf = compile_source(src)
    outs = []
    for shape, dtype in zip(launch.output_shapes, launch.output_dtypes):
        nan = np.full(shape, np.nan, np.float32)
        outs.append(to_numpy(mx.array(nan).astype(dtype)) if dtype != mx.float32 else nan)
    bufs = list(inputs) + outs
    assert len(bufs) == nbuf, (len(bufs), nbuf)
    ptrs = (ctypes.c_void_p * nbuf)(*[b.ctypes.data for b in bufs])
    lib.run(ptrs, *launch.grid, *launch.threadgroup)
    return outs


def emulate_decode(q: mx.array, kv: PagedKV, *, variant: str | None = None,
                   v1_simdgroups: int = _common.V1_SIMDGROUPS,
                   v2_simdgroups: int = _common.V2_SIMDGROUPS,
                   sources: dict[str, str] | None = None,
                   capture_only: bool = False, lse: bool = False,
                   ) -> mx.array | tuple[mx.array, mx.array] | list[str]:
    """``metal_paged_attention.paged_attention`` run in the emulator; ``sources`` overrides
    kernel bodies by kind. Returns ``[B, q_heads, 1, head_dim]`` in ``q.dtype`` (``lse``: the
    ``_lse`` twins' float32 output and ``[B, q_heads, 1]`` log-sum-exps), or with
    ``capture_only`` the generated sources of the launches without running them."""
    shape = _common.decode_shape(q, kv)
    inputs = _common.decode_inputs(q, kv, shape)
    launches = _common.plan(shape, variant or _common.choose_variant(shape), v1_simdgroups,
                            v2_simdgroups, lse=lse)
    if capture_only:
        srcs, prev = [], launches[0]
        for launch in launches:
            args = inputs
            if launch.kind.startswith("reduce"):   # v2's outputs, then meta
                args = [mx.zeros(s, d) for s, d in zip(prev.output_shapes, prev.output_dtypes)]
                args.append(inputs[-2])
            srcs.append(capture(launch.kind, launch, args, (sources or {}).get(launch.kind)))
            prev = launch
        return srcs
    np_inputs = [to_numpy(a) for a in inputs]
    outs: list[mx.array] = []
    np_outs: list[np.ndarray] = []
    for launch in launches:
        args, np_args = inputs, np_inputs
        if launch.kind.startswith("reduce"):
            args, np_args = outs + [inputs[-2]], np_outs + [np_inputs[-2]]
        src = capture(launch.kind, launch, args, (sources or {}).get(launch.kind))
        np_outs = run_launch(src, launch, np_args)
        outs = [from_numpy(o, d) for o, d in zip(np_outs, launch.output_dtypes)]
    out = outs[0].reshape(shape.batch, shape.q_heads, 1, shape.head_dim)
    return (out, outs[1].reshape(shape.batch, shape.q_heads, 1)) if lse else out


def prebuild(sources: list[str]) -> None:
    """Compile sources in parallel (one g++ per core) ahead of the tests that run them."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(compile_source, set(sources)))


make_case = _cases.random_case
reference_f32 = _cases.reference_f32
