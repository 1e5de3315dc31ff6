"""What a process under test runs on, read from ``/proc``: a child given
:func:`~mlxpa.blas.child_blas_env` maps the bench process's own fast BLAS (checked by reading
both processes' memory maps here), one without it maps MLX's bundled BLAS and is marked so in
the report; thread settings come from the child's own environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxpa.bench.process_env import blas_label, process_record
from mlxpa.bench.serve_report import problem_lines
from mlxpa.blas import child_blas_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

CHILD = ("import sys, mlx.core as mx; a = mx.ones((64, 64)); mx.eval(a @ a); "
         "print('ready', flush=True); sys.stdin.read()")


def maps_of(pid) -> list[str]:
    """The shared-library paths in ``/proc/PID/maps``, read here (not with mlxpa's reader)."""
    with open(f"/proc/{pid}/maps") as f:
        fields = [line.split() for line in f]
    return sorted({f[5] for f in fields if len(f) >= 6 and ".so" in os.path.basename(f[5])})


def fast_blas_in(maps: list[str]) -> list[str]:
    return [p for p in maps if os.path.basename(p).startswith(("libopenblas", "libmkl_rt"))]


def fast_blas(pid) -> list[str]:
    return fast_blas_in(maps_of(pid))


def _run_child(env: dict[str, str]):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _plain_env() -> dict[str, str]:
    """This environment as a plain shell has it: no BLAS preload, no mlxpa BLAS mode."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "MLXPA_BLAS", "OPENBLAS_CORETYPE")}


def test_a_child_with_child_blas_env_maps_this_process_blas():
    ours = fast_blas("self")
    if not ours:
        pytest.skip("no OpenBLAS/MKL mapped in this process")
    env = {**_plain_env(), **child_blas_env(), "OPENBLAS_NUM_THREADS": "2"}
    proc = _run_child(env)
    try:
        assert fast_blas(proc.pid) == ours
        record = process_record(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert record["blas"] == "fast" and record["blas_library"] == ours[0]
    assert blas_label(record) in ("openblas", "mkl")
    assert record["env"]["OPENBLAS_NUM_THREADS"] == "2"
    assert record["env"]["LD_PRELOAD"].split(":")[0] == ours[0]
    assert record["num_threads"] >= 1 and record["command"][:2] == [sys.executable, "-c"]


def test_a_child_without_it_runs_the_bundled_blas_and_is_marked():
    proc = _run_child({**_plain_env(), "MLXPA_BLAS": "bundled"})
    try:
        maps = maps_of(proc.pid)
        record = process_record(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(10)
    bundled = [p for p in maps if os.path.basename(p).startswith("libblas")]
    assert bundled and not fast_blas_in(maps)
    assert record["blas"] == "bundled" and record["blas_library"] == bundled[0]
    assert blas_label(record) == "bundled (slow)"
    lines = problem_lines([], {}, {"mlx-lm-server": record})
    assert len(lines) == 1 and lines[0].startswith("mlx-lm-server: its process runs MLX's "
                                                   "bundled reference BLAS")


def test_a_process_without_mlx_maps_no_blas():
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import sys; print('ready', "
                             "flush=True); sys.stdin.read()"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_plain_env())
    assert proc.stdout.readline().strip() == "ready"
    try:
        record = process_record(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert record["blas"] == "none" and record["blas_library"] is None
    assert process_record(None)["blas"] == "unknown"
