"""What a process under test actually runs on, read from ``/proc`` rather than assumed: the BLAS
library it maps, its thread settings and its command.

MLX's Linux CPU wheels map their bundled reference BLAS (``mlx_cpu.libs/libblas-*.so``) in
every process; a process that also maps OpenBLAS or MKL ahead of it (``LD_PRELOAD``, or
``import mlxpa``'s ``dlopen``) runs its matmuls there. A server that is not MLX (llama.cpp's
``llama-server``: ggml's own kernels) maps neither. The record says which, per process tree,
so a system on the slow BLAS is visible in the report instead of silently slower.
"""

from __future__ import annotations

import os
import re

import psutil

from mlxpa.blas import is_fast_blas

# The environment variables that pick a process's BLAS, its kernels and its threads.
ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS",
               "OPENBLAS_CORETYPE", "MLXPA_BLAS", "LD_PRELOAD")
_REFERENCE_BLAS = re.compile(r"^lib(c)?blas[-.]")
FAST, BUNDLED, NONE, UNKNOWN = "fast", "bundled", "none", "unknown"


def mapped_libraries(pid: int) -> list[str] | None:
    """The paths of the shared libraries process ``pid`` maps, in map order, each once
    (``/proc/PID/maps``; None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            paths = [fields[5].strip() for line in f
                     if len(fields := line.split(None, 5)) == 6 and ".so" in fields[5]]
    except OSError:
        return None
    return list(dict.fromkeys(p for p in paths if p.startswith("/")))


def blas_of(libraries: list[str]) -> tuple[str, str | None]:
    """``(kind, path)`` of the BLAS among mapped ``libraries``: ``fast`` and the OpenBLAS/MKL
    path; else ``bundled`` and the reference BLAS MLX ships (``libblas``); else ``none``."""
    for path in libraries:
        if is_fast_blas(path):
            return FAST, path
    for path in libraries:
        if _REFERENCE_BLAS.match(os.path.basename(path)):
            return BUNDLED, path
    return NONE, None


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    env = dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
    return {k: env[k] for k in ENV_VARS if k in env}


def process_record(pid: int | None) -> dict:
    """What process ``pid`` and its descendants run on, read from ``/proc``.

    The process of the tree that maps the most telling BLAS (fast, else bundled) is the one
    described (the model's process where a launcher starts it).

    Returns:
        ``{"pid", "command", "blas", "blas_library", "env", "num_threads"}``:
        ``blas`` is ``fast``, ``bundled``, ``none`` (neither mapped) or ``unknown`` (no pid,
        or the process cannot be read); ``blas_library`` the path mapped; ``env`` the
        process's own :data:`ENV_VARS`; ``num_threads`` its threads when read.
    """
    empty = {"pid": pid, "command": None, "blas": UNKNOWN, "blas_library": None,
             "env": {}, "num_threads": None}
    if pid is None:
        return empty
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return empty
    best, rank = None, -1
    for p in procs:
        libraries = mapped_libraries(p.pid)
        if libraries is None:
            continue
        kind, path = blas_of(libraries)
        score = {FAST: 2, BUNDLED: 1}.get(kind, 0)
        if score > rank:
            best, rank = (p, kind, path), score
    if best is None:
        return empty
    p, kind, path = best
    try:
        command, threads = p.cmdline(), p.num_threads()
    except psutil.Error:
        command, threads = None, None
    return {"pid": p.pid, "command": command, "blas": kind, "blas_library": path,
            "env": _environ(p.pid), "num_threads": threads}


def blas_label(record: dict) -> str:
    """The record's BLAS in a few words: ``openblas``, ``mkl``, ``bundled (slow)``, ``none``
    (a server that is not MLX) or ``unknown``."""
    kind = record.get("blas", UNKNOWN)
    if kind == FAST:
        return "mkl" if "mkl" in os.path.basename(record["blas_library"]) else "openblas"
    return "bundled (slow)" if kind == BUNDLED else kind
