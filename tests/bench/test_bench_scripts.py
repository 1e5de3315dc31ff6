"""Every ``benchmarks/*.py`` script's ``mlxpa`` imports resolve (no model run): a package move
that renames or moves a name must fail here, not the next time someone times a benchmark."""

from __future__ import annotations

import ast
import glob
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))


def mlxpa_imports(source: str) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each ``import mlxpa...`` (name None) and each name of a
    ``from mlxpa... import name``, at module level and inside functions and classes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names
                      if a.name.split(".")[0] == "mlxpa"]
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] == "mlxpa"):
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def unresolved(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (``import module`` when name is None) fails, or None."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        return f"no module {e.name}"
    if name is None or name == "*" or hasattr(mod, name):
        return None
    try:  # a submodule that the package does not import itself
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return f"{module} has no name {name}"
    return None


def test_finds_imports_at_every_level():
    source = ("import mlxpa.data as d\nimport os\nfrom mlxpa.bench import run_mlxpa\n"
              "def f():\n    from mlxpa.config import EngineConfig, Nope\n"
              "class C:\n    def g(self):\n        import mlxpa.run\n")
    assert mlxpa_imports(source) == [(1, "mlxpa.data", None), (3, "mlxpa.bench", "run_mlxpa"),
                                     (5, "mlxpa.config", "EngineConfig"),
                                     (5, "mlxpa.config", "Nope"), (8, "mlxpa.run", None)]
    assert unresolved("mlxpa.config", "EngineConfig") is None
    assert unresolved("mlxpa.config", "Nope") == "mlxpa.config has no name Nope"
    assert unresolved("mlxpa.no_such", None) == "no module mlxpa.no_such"
    assert unresolved("mlxpa", "bench") is None  # a submodule


def test_scripts_are_found():
    assert len(SCRIPTS) >= 5 and os.path.join(ROOT, "benchmarks", "quant_bench.py") in SCRIPTS


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_benchmark_script_imports_resolve(path):
    with open(path, encoding="utf-8") as f:
        imports = mlxpa_imports(f.read())
    problems = [f"{os.path.basename(path)} line {line}: {why}"
                for line, module, name in imports
                if (why := unresolved(module, name)) is not None]
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # four processes, each loading a model
def test_llm_vs_run_runs_on_a_tiny_model(tmp_path):
    """``benchmarks/llm_vs_run.py`` end to end on a tiny model and the README's rows: both
    sides run, their texts are identical, the summary is written."""
    import json
    import subprocess
    import sys

    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "llm_vs_run.py"),
                        "--model", folder, "--json", str(out)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "texts identical: True" in r.stdout
    summary = json.loads(out.read_text())
    assert summary["identical"] and summary["ratio"] > 0
    assert [run["generation_tokens"] for run in summary["runs"]["run"]] == [
        run["generation_tokens"] for run in summary["runs"]["llm"]]
