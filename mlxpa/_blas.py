"""The fast BLAS for MLX's Linux CPU back end, found and loaded before mlx.

MLX's Linux CPU wheels link the netlib reference BLAS. A shared library's undefined symbols
are looked up in the global scope first, so an OpenBLAS (or MKL) loaded with ``RTLD_GLOBAL``
before the first ``import mlx.core`` serves MLX's ``cblas_sgemm`` in this process, as
``LD_PRELOAD`` does for a whole process tree. ``import mlxpa`` calls :func:`preload` (the
in-process path of a notebook or script); the command line then finds the library mapped and
does not re-execute itself (:func:`mlxpa.blas.maybe_reexec`).

This module imports nothing of mlxpa and never imports mlx, so ``import mlxpa`` stays light;
:mod:`mlxpa.blas` (the command line's choice, ``python -m mlxpa.blas``) builds on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
import warnings

# MLXPA_BLAS=bundled keeps MLX's own BLAS in a process that imports mlxpa (what
# `--blas bundled` sets for the command it re-executes).
ENV_MODE = "MLXPA_BLAS"
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/opt/intel/oneapi/mkl/latest/lib/libmkl_rt.so.2",
)


def _ldconfig_paths() -> list[str]:
    """Library paths from the dynamic linker's cache (``ldconfig -p``), or [] when the cache
    cannot be read within 2 s. Reads one cache file; never walks a directory."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=2,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return [line.rsplit("=>", 1)[1].strip() for line in out.splitlines() if "=>" in line]
    return []


def is_fast_blas(path: str) -> bool:
    """Whether ``path`` names an OpenBLAS or MKL shared library (``libopenblas*.so*``,
    ``libmkl_rt.so*``)."""
    name = os.path.basename(path)
    return (name.startswith("libopenblas") and ".so" in name) or name.startswith("libmkl_rt.so")


def find_fast_blas() -> str | None:
    """Path (or soname) of an installed OpenBLAS (or MKL) shared library, or None.

    Looks only where a library can be found without walking the file system: a list of
    known paths (Debian/Ubuntu/Fedora/oneAPI), then the dynamic linker's cache
    (``ldconfig -p``, pthread builds first), then ``ctypes.util.find_library``. A recursive
    search of ``/usr/lib`` took over ten minutes on one machine before anything printed.
    """
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    # sonames only (libopenblas.so.0, libmkl_rt.so.N), not the versioned files they name
    cached = sorted((p for p in _ldconfig_paths()
                     if is_fast_blas(p) and (p.endswith(".so.0") or "mkl" in p)),
                    key=lambda p: ("pthread" not in p, "mkl" in p, p))
    if cached:
        return cached[0]
    for name in ("openblas", "mkl_rt"):
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def fast_blas_mapped() -> str | None:
    """The path of an OpenBLAS or MKL library mapped into this process (``/proc/self/maps``:
    preloaded, or loaded by :func:`preload`), or None (none, or not Linux)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)  # address perms offset dev inode path
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and is_fast_blas(path):
                    return path
    except OSError:
        pass
    return None


_GENERIC_CORES = {"Prescott", "Core2", "Katmai", "Coppermine", "Northwood", "Banias", "Atom",
                  "Nehalem", "Sandybridge", "unknown"}
_CORENAME = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
             "lib.openblas_get_corename.restype = ctypes.c_char_p; "
             "print(lib.openblas_get_corename().decode())")


def cpuinfo_field(name: str) -> str | None:
    """The first ``name`` field of ``/proc/cpuinfo`` (``"model name"``, ``"flags"``), or None
    where there is no such file or field (macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name) and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _openblas_corename(path: str) -> str | None:
    """The kernel set the OpenBLAS at ``path`` picks on this CPU, asked in a child process:
    OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when it is first loaded, so this process must
    not load it to ask."""
    env = {"OPENBLAS_NUM_THREADS": "1", "PATH": os.environ.get("PATH", "")}
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", _CORENAME, path], env=env,
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def coretype_override(path: str) -> str | None:
    """The ``OPENBLAS_CORETYPE`` to use with the OpenBLAS at ``path``: None when the library
    recognises this CPU (or it is not OpenBLAS), else the best kernel set the CPU supports.

    Older OpenBLAS builds (Debian 12 ships 0.3.21) do not recognise recent Intel server CPUs
    and fall back to the generic ``Prescott`` kernels (about 40 GFLOP/s instead of 170-210
    for a float32 2048^3 matmul on the development machine); with AVX-512 (or AVX2/FMA) the
    answer is ``SkylakeX`` (or ``Haswell``)."""
    if "openblas" not in os.path.basename(path):
        return None
    if _openblas_corename(path) not in _GENERIC_CORES:
        return None
    flags = set((cpuinfo_field("flags") or "").split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def blas_env(path: str) -> dict[str, str]:
    """Environment variables that preload the BLAS at ``path`` (and pick its kernels)."""
    env = {"LD_PRELOAD": ":".join(p for p in (path, os.environ.get("LD_PRELOAD")) if p)}
    if "OPENBLAS_CORETYPE" not in os.environ:
        core = coretype_override(path)
        if core:
            env["OPENBLAS_CORETYPE"] = core
    return env


def preload() -> str | None:
    """Load an installed OpenBLAS/MKL into this process before mlx, so MLX binds to it.

    On Linux, unless ``MLXPA_BLAS=bundled``: when ``mlx.core`` is not imported yet and no fast
    BLAS is mapped, loads :func:`find_fast_blas`'s library with ``RTLD_GLOBAL`` (after setting
    ``OPENBLAS_CORETYPE`` where :func:`coretype_override` says). When ``mlx.core`` was imported
    first and runs the bundled BLAS, warns once (``RuntimeWarning``) with the remedy.

    Returns:
        The path of the fast BLAS mapped in the process afterwards, or None.
    """
    if not sys.platform.startswith("linux") or os.environ.get(ENV_MODE) == "bundled":
        return None
    mapped = fast_blas_mapped()
    if mapped is not None:
        return mapped
    path = find_fast_blas()
    if "mlx.core" in sys.modules:
        remedy = ("import mlxpa before mlx, or start Python under "
                  "eval \"$(python -m mlxpa.blas)\" (LD_PRELOAD)" if path is not None else
                  "install OpenBLAS (apt-get install libopenblas0-pthread) and import mlxpa "
                  "before mlx")
        warnings.warn("mlx was imported before mlxpa and runs MLX's slow bundled reference "
                      f"BLAS (10-30x slower CPU matmuls); {remedy}", RuntimeWarning,
                      stacklevel=3)
        return None
    if path is None:
        return None
    if "OPENBLAS_CORETYPE" not in os.environ:
        core = coretype_override(path)
        if core:
            os.environ["OPENBLAS_CORETYPE"] = core
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return fast_blas_mapped() or path
