"""Pick a fast BLAS for MLX's Linux CPU back end.

MLX's Linux CPU wheels link the netlib reference BLAS (about 6 GFLOP/s for a float32
2048^3 matmul on the development machine, 100–200 GFLOP/s with OpenBLAS preloaded). On Linux,
``mlxpa`` re-executes itself once with an installed OpenBLAS or MKL in ``LD_PRELOAD`` (mode
``auto``, the default); ``system`` insists on one (error when none), ``bundled`` keeps MLX's.
"""

from __future__ import annotations

import glob
import os
import sys

_GUARD = "MLXPA_BLAS_REEXEC"
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/opt/intel/oneapi/mkl/latest/lib/libmkl_rt.so.2",
)


def find_fast_blas() -> str | None:
    """Path of an installed OpenBLAS (or MKL) shared library, or None."""
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    hits = sorted(glob.glob("/usr/lib*/**/libopenblas*.so.0", recursive=True))
    return hits[0] if hits else None


def loaded_blas() -> str:
    """Which BLAS this process runs: ``openblas``, ``mkl`` or ``bundled`` (Linux; ``system``
    elsewhere: macOS uses Accelerate)."""
    if not sys.platform.startswith("linux"):
        return "system"
    preload = os.environ.get("LD_PRELOAD", "")
    if "openblas" in preload:
        return "openblas"
    if "mkl" in preload:
        return "mkl"
    return "bundled"


def argv_blas_mode(argv: list[str]) -> str:
    """The ``--blas`` value in ``argv`` (default ``auto``)."""
    for i, a in enumerate(argv):
        if a == "--blas" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--blas="):
            return a.split("=", 1)[1]
    return "auto"


def maybe_reexec(mode: str) -> str | None:
    """Re-execute the current command with a fast BLAS preloaded when ``mode`` asks for it.

    Returns:
        A one-line hint to print when no fast BLAS is installed (mode ``auto`` on Linux),
        else None. Does not return when it re-executes.

    Raises:
        RuntimeError: ``mode`` is ``system`` and no OpenBLAS/MKL is installed.
    """
    if (mode == "bundled" or not sys.platform.startswith("linux")
            or loaded_blas() != "bundled" or os.environ.get(_GUARD)):
        return None
    path = find_fast_blas()
    if path is None:
        if mode == "system":
            raise RuntimeError("--blas system: no OpenBLAS or MKL library found "
                               "(Debian/Ubuntu: apt-get install libopenblas0-pthread)")
        return ("hint: MLX is using its slow bundled reference BLAS; "
                "`apt-get install libopenblas0-pthread` makes the CPU path 10-30x faster")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (path, env.get("LD_PRELOAD")) if p)
    env[_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "mlxpa", *sys.argv[1:]], env)
    return None
