"""The README's module table and ARCHITECTURE.md name every module of the tree, and nothing that
is not in it (the documents are drawn from the tree; this keeps them so)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlxpa"


def tree() -> dict[str, list[str]]:
    """Top-level modules under "", each package's module files under "<package>/"."""
    out: dict[str, list[str]] = {"": sorted(p.name for p in PACKAGE.glob("*.py")
                                            if p.name not in ("__init__.py", "__main__.py"))}
    for d in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        out[f"{d.name}/"] = sorted(p.name for p in d.glob("*.py") if p.name != "__init__.py")
    return out


def module_table() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("| module | role |")
    return [line for line in text[start:].splitlines() if line.startswith("|")][2:]


def test_readme_module_table_names_every_module():
    rows = module_table()
    named = {m for row in rows for m in re.findall(r"`([\w/]+\.py|\w+/)`", row.split(" | ")[0])}
    for package, files in tree().items():
        if package:
            row = next((r for r in rows if r.startswith(f"| `{package}`")), None)
            assert row is not None, f"README module table has no row for {package}"
            first = row.split(" | ")[0]
            assert all(f"`{f}`" in first for f in files), (package, files, first)
        else:
            assert set(files) <= named, set(files) - named
    known = {f for files in tree().values() for f in files} | set(tree())
    assert named - {"__init__.py"} <= known, named - known


def test_architecture_names_every_package():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for package in tree():
        if package:
            assert f"`{package}`" in text, package
    for name in tree()[""]:
        assert f"`{name}`" in text, name
