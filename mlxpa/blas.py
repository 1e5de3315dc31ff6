"""Pick a fast BLAS for MLX's Linux CPU back end.

MLX's Linux CPU wheels link the netlib reference BLAS (about 6 GFLOP/s for a float32
2048^3 matmul on the development machine, 100–200 GFLOP/s with OpenBLAS). ``import mlxpa``
loads an installed OpenBLAS or MKL into the process before mlx (:func:`mlxpa._blas.preload`:
notebooks and scripts get it too). The command line checks what is mapped and re-executes
itself once only where that did not happen: with the library in ``LD_PRELOAD`` (mode
``auto``, the default, or ``system``, which insists on one: error when none), or, for
``bundled``, without it and with ``MLXPA_BLAS=bundled`` (MLX's own BLAS).

Older OpenBLAS builds do not recognise recent Intel server CPUs and fall back to generic
kernels; ``OPENBLAS_CORETYPE`` is then set (:func:`coretype_override`). Checked against a
float64 product: relative error 6e-7 either way.

``python -m mlxpa.blas`` prints the ``export`` lines, for running tests or scripts (and any
child processes they start) at the same speed.
"""

from __future__ import annotations

import os
import sys

from mlxpa._blas import (
    ENV_MODE,
    blas_env,
    coretype_override,
    cpuinfo_field,
    fast_blas_mapped,
    find_fast_blas,
    is_fast_blas,
)

__all__ = ["BLAS_MODES", "argv_blas_mode", "available_memory_bytes", "blas_env",
           "child_blas_env", "coretype_override", "cpuinfo_field", "fast_blas_mapped",
           "find_fast_blas", "host_memory_bytes", "loaded_blas", "maybe_reexec"]

_GUARD = "MLXPA_BLAS_REEXEC"


def host_memory_bytes() -> int | None:
    """Physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def available_memory_bytes() -> int | None:
    """Memory this process could still allocate, in bytes: ``MemAvailable`` of
    ``/proc/meminfo``, capped by the cgroup v2 limit (``memory.max - memory.current``) of a
    container; None where the system does not say (macOS)."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def loaded_blas() -> str:
    """Which BLAS this process runs: ``openblas`` (with its ``OPENBLAS_CORETYPE``), ``mkl``
    or ``bundled`` on Linux, from the libraries mapped in the process; ``system`` elsewhere
    (macOS uses Accelerate)."""
    if not sys.platform.startswith("linux"):
        return "system"
    path = fast_blas_mapped()
    if path is None:
        return "bundled"
    if "mkl" in os.path.basename(path):
        return "mkl"
    core = os.environ.get("OPENBLAS_CORETYPE")
    return f"openblas ({core})" if core else "openblas"


def child_blas_env() -> dict[str, str]:
    """The environment variables that give a child process the BLAS this process runs (what
    ``python -m mlxpa.blas`` prints, for a process that starts MLX servers or scripts).

    ``import mlxpa`` maps OpenBLAS by ``dlopen`` inside this process, which a child started
    with ``os.environ`` does not inherit: the child gets it in ``LD_PRELOAD`` (with this
    process's ``OPENBLAS_CORETYPE``, else :func:`coretype_override`'s). A process on MLX's
    bundled BLAS (``--blas bundled``, or none installed) passes that on: ``MLXPA_BLAS=bundled``
    and no fast BLAS in ``LD_PRELOAD``. Elsewhere than Linux: {}.
    """
    if not sys.platform.startswith("linux"):
        return {}
    path = fast_blas_mapped()
    if path is None:
        kept = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and not is_fast_blas(p)]
        return {"LD_PRELOAD": ":".join(kept), ENV_MODE: "bundled"}
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    env = {"LD_PRELOAD": ":".join([path, *(p for p in preloaded if p != path)])}
    core = os.environ.get("OPENBLAS_CORETYPE") or coretype_override(path)
    if core:
        env["OPENBLAS_CORETYPE"] = core
    return env


BLAS_MODES = ("auto", "system", "bundled")


def argv_blas_mode(argv: list[str]) -> str:
    """The ``--blas`` value in ``argv`` (default ``auto``)."""
    for i, a in enumerate(argv):
        if a == "--blas" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--blas="):
            return a.split("=", 1)[1]
    return "auto"


def maybe_reexec(mode: str) -> str | None:
    """Re-execute the current command when the BLAS mapped in this process is not what
    ``mode`` asks for: ``auto``/``system`` with none mapped (``import mlxpa`` could not load
    one) re-run with one in ``LD_PRELOAD``; ``bundled`` with one mapped re-runs without it
    (``MLXPA_BLAS=bundled``). ``auto`` with ``MLXPA_BLAS=bundled`` set means ``bundled``.

    Returns:
        A one-line hint to print when no fast BLAS is installed (mode ``auto`` on Linux),
        else None. Does not return when it re-executes.

    Raises:
        RuntimeError: ``mode`` is ``system`` and no OpenBLAS/MKL is installed.
    """
    if not sys.platform.startswith("linux") or os.environ.get(_GUARD):
        return None
    if mode == "auto" and os.environ.get(ENV_MODE) == "bundled":
        mode = "bundled"
    mapped = fast_blas_mapped()
    if mode == "bundled":
        if mapped is None:
            return None
        kept = [p for p in os.environ.get("LD_PRELOAD", "").split(":")
                if p and not is_fast_blas(p)]
        env = {**os.environ, "LD_PRELOAD": ":".join(kept), ENV_MODE: "bundled"}
        return _reexec(env)
    if mapped is not None:
        return None
    path = find_fast_blas()
    if path is None:
        if mode == "system":
            raise RuntimeError("--blas system: no OpenBLAS or MKL library found "
                               "(Debian/Ubuntu: apt-get install libopenblas0-pthread)")
        return ("hint: MLX is using its slow bundled reference BLAS; "
                "`apt-get install libopenblas0-pthread` makes the CPU path 10-30x faster")
    return _reexec({**os.environ, **blas_env(path)})


def _reexec(env: dict[str, str]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "mlxpa", *sys.argv[1:]],
              {**env, _GUARD: "1"})


if __name__ == "__main__":
    # What the environment preloads (not what `import mlxpa` just loaded in this process):
    # the export lines make child processes fast too.
    fast = find_fast_blas()
    preloaded = any(is_fast_blas(p) for p in os.environ.get("LD_PRELOAD", "").split(":"))
    if sys.platform.startswith("linux") and fast and not preloaded:
        exports = blas_env(fast)
        if "OPENBLAS_CORETYPE" in os.environ:  # the user's, or what `import mlxpa` picked
            exports["OPENBLAS_CORETYPE"] = os.environ["OPENBLAS_CORETYPE"]
        for key, value in exports.items():
            print(f"export {key}={value}")
