"""``mlxpa.core`` is pure Python: importing each core module in a fresh interpreter loads no mlx."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import mlxpa.core

CORE_MODULES = sorted(f"mlxpa.core.{m.name}" for m in pkgutil.iter_modules(mlxpa.core.__path__))


def loaded_mlx(modules: list[str]) -> str:
    """The ``mlx`` / ``mlx_lm`` modules that importing ``modules`` in a fresh interpreter
    loads, comma-separated (empty: none)."""
    code = (
        f"import {', '.join(modules)}\n"
        "import sys\n"
        "loaded = sorted(m for m in sys.modules\n"
        "                if m in ('mlx', 'mlx_lm') or m.startswith(('mlx.', 'mlx_lm.')))\n"
        "print(','.join(loaded))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_core_modules_listed():
    assert {"mlxpa.core.block_pool", "mlxpa.core.radix_cache", "mlxpa.core.kv_cache_manager",
            "mlxpa.core.scheduler", "mlxpa.core.prefix_order"} <= set(CORE_MODULES)


def test_core_imports_no_mlx():
    loaded = loaded_mlx(CORE_MODULES)
    assert loaded == "", f"mlxpa.core loaded {loaded}"
