"""BLAS selection on Linux: the preload environment and the OpenBLAS kernel override."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxpa import _blas, blas


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
    monkeypatch.setattr(_blas, "_CANDIDATES", ("/nonexistent/libopenblas.so.0",))
    fake = ("3 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibopenblas.so.0 (libc6,x86-64) => /opt/x/openblas-serial/libopenblas.so.0\n"
            "\tlibopenblas.so.0 (libc6,x86-64) => /opt/x/openblas-pthread/libopenblas.so.0\n"
            "\tlibm.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libm.so.6\n")

    def fake_run(cmd, **kwargs):
        assert cmd[-1] == "-p" and "ldconfig" in cmd[0]
        return subprocess.CompletedProcess(cmd, 0, stdout=fake, stderr="")

    monkeypatch.setattr(_blas.subprocess, "run", fake_run)
    assert blas.find_fast_blas() == "/opt/x/openblas-pthread/libopenblas.so.0"
    monkeypatch.setattr(_blas.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.setattr(_blas.ctypes.util, "find_library", lambda name: None)
    assert blas.find_fast_blas() is None



# --- the fast BLAS in-process: `import mlxpa` before mlx -----------------------------------

FAST = blas.find_fast_blas()
needs_fast = pytest.mark.skipif(FAST is None or not sys.platform.startswith("linux"),
                                reason="no OpenBLAS/MKL installed (Linux)")
MATMUL = ("import time, mlx.core as mx\n"
          "a = mx.random.normal((1024, 1024)); mx.eval(a @ a)\n"
          "times = []\n"
          "for _ in range(3):\n"
          "    t = time.perf_counter(); mx.eval(a @ a); times.append(time.perf_counter() - t)\n"
          "maps = open('/proc/self/maps').read()\n"
          "print(sorted(times)[1], 'openblas' in maps or 'mkl_rt' in maps)\n")


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter without any BLAS preloaded by the environment."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("LD_PRELOAD", "OPENBLAS_CORETYPE", "MLXPA_BLAS")}
    clean["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(blas.__file__)))
    return subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True,
                          text=True, timeout=300, env={**clean, **env}, check=True)


@needs_fast
def test_import_mlxpa_first_maps_the_fast_blas_and_multiplies_faster():
    """A notebook's order (import mlxpa, then mlx): the library is mapped in the process and
    a 1024^3 float32 matmul is faster than with MLX's bundled BLAS (MLXPA_BLAS=bundled, the
    in-process form of --blas bundled); a ratio, both measured here."""
    fast_s, fast_mapped = _fresh("import mlxpa\n" + MATMUL).stdout.split()
    slow_s, slow_mapped = _fresh("import mlxpa\n" + MATMUL, MLXPA_BLAS="bundled").stdout.split()
    assert (fast_mapped, slow_mapped) == ("True", "False")
    assert float(slow_s) / float(fast_s) > 3


@needs_fast
def test_the_python_api_keeps_the_fast_blas(tmp_path):
    """``import mlxpa; from mlxpa import LLM``, a model loaded and run, in a fresh process:
    the fast library is mapped and the matmul runs on it."""
    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model(tmp_path / "tiny")
    code = ("import mlxpa\nfrom mlxpa import LLM, SamplingParams\n"
            f"llm = LLM({folder!r}, kv_cache_memory_bytes=2**22)\n"
            "out = llm.generate(['hello'], SamplingParams(max_tokens=3), use_tqdm=False)\n"
            "assert len(out[0].outputs[0].token_ids) > 0\n" + MATMUL)
    _, mapped = _fresh(code).stdout.split()
    assert mapped == "True"


@needs_fast
def test_mlx_imported_first_warns_with_the_remedy():
    r = _fresh("import mlx.core\nimport mlxpa\n")
    warnings = [line for line in r.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "RuntimeWarning: mlx was imported before mlxpa and runs MLX's slow bundled reference "
        "BLAS (10-30x slower CPU matmuls); import mlxpa before mlx, or start Python under "
        'eval "$(python -m mlxpa.blas)" (LD_PRELOAD)')
    # with the library preloaded by the environment there is nothing to say
    r = _fresh("import mlx.core\nimport mlxpa\n", LD_PRELOAD=FAST)
    assert "RuntimeWarning" not in r.stderr


def test_no_fast_blas_installed_warns_to_install_one(monkeypatch):
    """mlx imported first (it is, in this test process) and nothing to preload."""
    monkeypatch.delenv("MLXPA_BLAS", raising=False)
    monkeypatch.setattr(_blas, "fast_blas_mapped", lambda: None)
    monkeypatch.setattr(_blas, "find_fast_blas", lambda: None)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setitem(sys.modules, "mlx.core", sys.modules.get("mlx.core", object()))
    with pytest.warns(RuntimeWarning, match=r"install OpenBLAS \(apt-get install "
                      r"libopenblas0-pthread\) and import mlxpa before mlx"):
        assert _blas.preload() is None


def test_import_mlxpa_stays_light():
    """No mlx, mlx-lm or numpy at import (the CLI's --help stays instant)."""
    r = _fresh("import sys, mlxpa\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in "
               "('mlx', 'mlx_lm', 'numpy', 'transformers', 'pyarrow')))")
    assert r.stdout.strip() == "[]"


@needs_fast
def test_cli_keeps_the_in_process_blas_and_bundled_reexecs_without_it():
    """The command line finds the library `import mlxpa` mapped: no re-execution for auto;
    --blas bundled re-executes (os.execve recorded here) with MLXPA_BLAS=bundled and no fast
    BLAS in LD_PRELOAD; and the real command line with --blas bundled still runs."""
    code = ("import os, sys\nsys.argv = ['mlxpa', 'plan', '--help']\n"
            "from mlxpa.blas import loaded_blas, maybe_reexec\n"
            "os.execve = lambda exe, argv, env: print('execve', env['MLXPA_BLAS'], "
            "'openblas' in env.get('LD_PRELOAD', ''), argv[1:])\n"
            "print(maybe_reexec('auto'), loaded_blas().split()[0])\n"
            "maybe_reexec('bundled')\n")
    out = _fresh(code, LD_PRELOAD=FAST).stdout.splitlines()
    assert out == ["None openblas", "execve bundled False ['-m', 'mlxpa', 'plan', '--help']"]
    r = _fresh("import subprocess, sys\n"
               "subprocess.run([sys.executable, '-m', 'mlxpa', 'plan', '--help', '--blas', "
               "'bundled'], check=True)\n")
    assert r.stdout.startswith("Usage: mlxpa plan")


@needs_fast
def test_blas_exports_still_printed_after_the_in_process_preload(monkeypatch):
    r = _fresh("import runpy\nrunpy.run_module('mlxpa.blas', run_name='__main__')")
    assert r.stdout.startswith(f"export LD_PRELOAD={FAST}")
    r = subprocess.run([sys.executable, "-m", "mlxpa.blas"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
                       check=True)
    assert r.stdout.startswith(f"export LD_PRELOAD={FAST}") and r.stderr == ""
