"""BLAS selection on Linux: the preload environment and the OpenBLAS kernel override."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxpa import blas


def test_argv_blas_mode():
    assert blas.argv_blas_mode(["run", "x", "--blas", "bundled"]) == "bundled"
    assert blas.argv_blas_mode(["run", "--blas=system"]) == "system"
    assert blas.argv_blas_mode(["run", "x"]) == "auto"


def test_non_openblas_library_gets_no_coretype(tmp_path):
    assert blas.coretype_override(str(tmp_path / "libmkl_rt.so.2")) is None


@pytest.mark.skipif(blas.find_fast_blas() is None, reason="no OpenBLAS installed")
def test_blas_env_preloads_and_mlx_still_computes_right(monkeypatch):
    """The printed environment makes a fresh MLX process multiply correctly (float64 check)."""
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    env = {**os.environ, **blas.blas_env(blas.find_fast_blas())}
    code = ("import mlx.core as mx, numpy as np; r = np.random.default_rng(0); "
            "a = r.standard_normal((300, 200)).astype('f4'); "
            "b = r.standard_normal((200, 100)).astype('f4'); "
            "got = np.array(mx.array(a) @ mx.array(b)); ref = a.astype('f8') @ b; "
            "print(abs(got - ref).max() / abs(ref).max())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert float(out.stdout) < 1e-5
    assert "openblas" in env["LD_PRELOAD"]


def test_find_fast_blas_never_walks_the_file_system(monkeypatch):
    """Issue: a recursive glob of /usr/lib took minutes. Only known paths and the linker's
    cache are consulted; any directory listing fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("find_fast_blas walked a directory")

    import glob

    for mod, name in ((os, "walk"), (os, "scandir"), (os, "listdir"), (glob, "glob"),
                      (glob, "iglob")):
        monkeypatch.setattr(mod, name, forbidden)
    monkeypatch.setattr(blas, "_CANDIDATES", ("/nonexistent/libopenblas.so.0",))
    fake = ("3 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibopenblas.so.0 (libc6,x86-64) => /opt/x/openblas-serial/libopenblas.so.0\n"
            "\tlibopenblas.so.0 (libc6,x86-64) => /opt/x/openblas-pthread/libopenblas.so.0\n"
            "\tlibm.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libm.so.6\n")

    def fake_run(cmd, **kwargs):
        assert cmd[-1] == "-p" and "ldconfig" in cmd[0]
        return subprocess.CompletedProcess(cmd, 0, stdout=fake, stderr="")

    monkeypatch.setattr(blas.subprocess, "run", fake_run)
    assert blas.find_fast_blas() == "/opt/x/openblas-pthread/libopenblas.so.0"
    monkeypatch.setattr(blas.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.setattr(blas.ctypes.util, "find_library", lambda name: None)
    assert blas.find_fast_blas() is None

