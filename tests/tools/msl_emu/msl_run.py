"""Capture the Metal source MLX generates for a ``mx.fast.metal_kernel`` call and build it
into a CPU shared library with ``msl_emu.h`` (mlxpa's test emulator; no Metal needed).

1. :func:`generated_msl` traces the call inside ``mx.export_function``; with ``verbose=True``
   MLX prints the exact source it would compile on a Mac, even on a machine without Metal.
2. :func:`build` compiles that source as C++20 after ``msl_emu.h`` with a C entry point
   ``run(void** buffers, gx, gy, gz, tx, ty, tz)`` (grid and threadgroup in threads) that
   passes buffer ``i`` to the kernel's ``[[buffer(i)]]`` parameter and the thread attributes
   to the others, and returns how many buffers the kernel takes.

Call the library with ctypes (buffers as numpy arrays, inputs then outputs, in the order of
the generated signature) and compare with a reference.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CXXFLAGS = ["-std=c++20", "-O1", "-g", "-pthread", "-fPIC", "-Wno-attributes"]


def generated_msl(fn, *args) -> str:
    """The Metal source of the kernel ``fn(*args)`` launches (``fn`` calls a
    ``mx.fast.metal_kernel`` with ``verbose=True``).

    Raises:
        ValueError: MLX printed no source block.
    """
    import mlx.core as mx

    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile("w+") as captured:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)  # MLX prints from C++: capture the file descriptor
        try:
            mx.export_function(os.path.join(folder, "kernel.mlxfn"), fn, *args)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        text = captured.read()
    match = re.search(r"```\n(.*)```", text, re.S)
    if match is None:
        raise ValueError("MLX printed no kernel source (verbose=True missing?)")
    return match.group(1)


def _kernel_call(src: str) -> tuple[str, int]:
    """The C++ call of the kernel instance in ``src`` from the entry point, and the number
    of buffers it takes."""
    inst = re.search(r"decltype\((\w+)(<[^)]*>)?\)", src)
    if inst is None:
        raise ValueError("no kernel instantiation (decltype(...)) in the source")
    name, template_args = inst.group(1), inst.group(2) or ""
    start = src.index(name + "(") + len(name) + 1
    params = src[start:src.index(") {", start)]
    args: list[tuple[int, str]] = []  # (order, C++ expression)
    num_buffers = 0
    for i, param in enumerate(p.strip() for p in params.split(",\n")):
        decl, attr = re.fullmatch(r"(.*?)\s*\[\[(.*)\]\]", param, re.S).groups()
        buffer = re.fullmatch(r"buffer\((\d+)\)", attr)
        if buffer is None:
            args.append((i, f"a.{attr}"))
            continue
        index = int(buffer.group(1))
        num_buffers = max(num_buffers, index + 1)
        ctype = re.sub(r"\b(device|constant)\b", "", decl.rsplit(" ", 1)[0]).strip()
        if ctype.endswith("&"):  # a scalar passed by reference
            args.append((i, f"*reinterpret_cast<{ctype[:-1].strip()}*>(buffers[{index}])"))
        else:
            args.append((i, f"reinterpret_cast<{ctype}>(buffers[{index}])"))
    call = f"{name}{template_args}({', '.join(expr for _, expr in sorted(args))})"
    return call, num_buffers


def build(src: str, so_path: str, asan: bool = False) -> int:
    """Compile ``src`` into the shared library ``so_path``; returns its buffer count.

    Raises:
        RuntimeError: g++ failed (its first error line).
    """
    call, num_buffers = _kernel_call(src)
    cpp = os.path.splitext(so_path)[0] + ".cpp"
    with open(cpp, "w") as f:
        f.write(f'#include "msl_emu.h"\n{src}\n'
                'extern "C" void run(void** buffers, unsigned gx, unsigned gy, unsigned gz, '
                "unsigned tx, unsigned ty, unsigned tz) {\n"
                "  msl_emu::dispatch({gx, gy, gz}, {tx, ty, tz}, "
                "[&](const msl_emu::ThreadAttrs& a) {\n"
                f"    {call};\n  }});\n}}\n")
    cmd = ["g++", *CXXFLAGS, "-shared", "-I", HERE, cpp, "-o", so_path]
    if asan:
        cmd[1:1] = ["-fsanitize=address", "-fno-omit-frame-pointer"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        errors = [line for line in r.stderr.splitlines() if "error" in line]
        raise RuntimeError("compile failed: " + (errors[0] if errors else r.stderr[-500:]))
    return num_buffers
