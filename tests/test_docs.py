"""The documents stay true to the tree: ARCHITECTURE.md has one row per package whose "imports"
cell is exactly what the package's modules import (an AST scan, imports inside functions
included), only the arrows it names run back up, every relative link in the documents resolves,
and README.md stays a newcomer's page."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlxpa"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
DOCS = [ROOT / "README.md", ARCHITECTURE, *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "README.md"]


def units() -> set[str]:
    """The packages of the layout: each sub-package (``core``) and each top-level module
    (``config``, ``__init__``, ``__main__``)."""
    return ({p.stem for p in PACKAGE.glob("*.py")}
            | {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()})


def shown(unit: str) -> str:
    """How the documents write a package: ``core/``, ``config.py``."""
    return f"{unit}/" if (PACKAGE / unit).is_dir() else f"{unit}.py"


def unit_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """Every absolute name ``path`` imports, with its line: ``import a.b`` gives ``a.b``,
    ``from a import b`` gives ``a.b`` (``b`` a module or a name); relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def code_arrows() -> dict[str, dict[str, str]]:
    """``{package: {imported package: "file:line" of one such import}}`` over mlxpa/; a name
    that ``mlxpa/__init__.py`` exports (``from mlxpa import LLM``) is an arrow to ``__init__``."""
    known = units()
    arrows: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        src = unit_of(path)
        for name, line in imported_modules(path):
            parts = name.split(".")
            if parts[0] != "mlxpa":
                continue
            dst = parts[1] if len(parts) > 1 and parts[1] in known else "__init__"
            if dst != src:
                arrows[src].setdefault(dst, f"{path.relative_to(ROOT)}:{line}")
    return arrows


def table() -> list[tuple[str, str, set[str]]]:
    """ARCHITECTURE.md's package table, bottom floor first: ``(package, what, imports)``."""
    text = ARCHITECTURE.read_text()
    start = text.index("| package | what it does | imports |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        first, what, imports = (cell.strip() for cell in line.strip("|").split(" | "))
        names = re.findall(r"`([\w.]+?)(?:/|\.py)?`", first)
        assert len(names) == 1, f"ARCHITECTURE.md: a package row names one package: {first}"
        rows.append((names[0], what, {m.split(".")[0] for m in re.findall(r"`([\w.]+)`",
                                                                          imports)}))
    return rows


def documented_upward() -> set[tuple[str, str]]:
    """The arrows ARCHITECTURE.md's import rules say run back up (`` `a` → `b` ``)."""
    text = ARCHITECTURE.read_text()
    rules = text[text.index("## Import rules"):]
    rules = rules[: rules.index("\n## ", 1)]
    return set(re.findall(r"`(\w+)` → `(\w+)`", rules))


def test_architecture_has_one_row_per_package():
    named = [package for package, _, _ in table()]
    assert len(named) == len(set(named)), f"ARCHITECTURE.md names a package twice: {named}"
    missing = sorted(units() - set(named))
    assert not missing, ("ARCHITECTURE.md's package table has no row for "
                         + ", ".join(f"`{shown(m)}`" for m in missing)
                         + " (add a row at its floor: what it does, what it imports)")
    stale = sorted(set(named) - units())
    assert not stale, f"ARCHITECTURE.md has rows for packages that are gone: {stale}"


def test_a_row_is_one_short_line():
    for package, what, _ in table():
        assert len(what.split()) <= 25, f"ARCHITECTURE.md row `{package}`: {len(what.split())} " \
            "words (at most 25; details belong in the module docstrings)"


def test_imports_column_is_what_the_code_imports():
    arrows = code_arrows()
    problems = []
    for package, _, documented in table():
        real, name = arrows.get(package, {}), shown(package)
        problems += [f"`{name}` imports `{dst}` ({where}): add `{dst}` to its imports cell"
                     for dst, where in sorted(real.items()) if dst not in documented]
        problems += [f"`{name}` lists `{dst}` in its imports cell, but none of its modules "
                     "imports it: remove it" for dst in sorted(documented - set(real))]
    assert not problems, "ARCHITECTURE.md's imports column:\n" + "\n".join(problems)


def test_no_undocumented_arrow_runs_back_up():
    floor = {package: i for i, (package, _, _) in enumerate(table())}
    arrows = code_arrows()
    upward = {(src, dst): where for src, dsts in arrows.items() for dst, where in dsts.items()
              if src in floor and dst in floor and floor[dst] >= floor[src]}
    documented = documented_upward()
    new = [f"`{shown(src)}` imports `{dst}` ({where}), which stands above it in the package "
           "table: move a row, or name the arrow in the import rules (`a` → `b`)"
           for (src, dst), where in sorted(upward.items()) if (src, dst) not in documented]
    gone = [f"the import rules say `{src}` → `{dst}` runs back up, but no such import is left: "
            "drop the sentence" for src, dst in sorted(documented - set(upward))]
    assert not new + gone, "\n".join(new + gone)


def test_no_import_cycle_between_modules():
    """ARCHITECTURE.md: no import cycles between modules, imports inside functions included."""
    import graphlib

    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        graph[module] = set()
        for name, _ in imported_modules(path):
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != module:
                graph[module].add(".".join(parts))
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"an import cycle: {' -> '.join(err.args[1])}") from None


def test_the_scan_sees_imports_inside_functions():
    """The AST scan is not vacuous: ``batch/setup.py`` imports ``loader`` inside a function."""
    names = {name for name, _ in imported_modules(PACKAGE / "batch" / "setup.py")}
    assert "mlxpa.loader.models.load_model" in names
    assert "loader" in code_arrows()["batch"]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: the rendered text lower-cased, without
    punctuation but hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = defaultdict(int)
    out = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def links(path: Path) -> list[str]:
    """The link targets of ``path`` outside code fences and code spans."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_relative_links_resolve():
    broken = []
    for doc in DOCS:
        for target in links(doc):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_links_see_headings_and_files():
    """The link check is not vacuous: it finds the README's links into docs/."""
    assert any(t.startswith("docs/") for t in links(ROOT / "README.md"))
    assert slug("Scale-out: `mlxpa run --ray`") == "scale-out-mlxpa-run---ray"
    assert slug("[Choice rows](x.md): scored, not decoded") == "choice-rows-scored-not-decoded"


def test_readme_is_a_newcomers_page():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 15 * 1024, f"README.md is {size} bytes; at most 15 KB, the rest in docs/"


def test_cli_page_names_every_run_option():
    """docs/cli.md's table of ``mlxpa run``'s options names each option the command has (one
    spelling of a ``--x/--no-x`` pair is enough), and no option it does not have."""
    import typer.main

    from mlxpa.cli import app

    run = typer.main.get_command(app).commands["run"]
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("| group | options |"):]
    table = table[: table.index("\n\n")]
    named = set(re.findall(r"`(--[\w-]+)", table))
    spellings = [{o for o in p.opts + p.secondary_opts if o.startswith("--")} for p in run.params]
    spellings = [s for s in spellings if s - {"--help"}]
    missing = sorted(min(s) for s in spellings if not s & named)
    assert not missing, f"docs/cli.md does not name these `mlxpa run` options: {missing}"
    unknown = sorted(named - set().union(*spellings))
    assert not unknown, f"docs/cli.md names options `mlxpa run` does not have: {unknown}"


DIARY = [r"\bissue \d+", r"load average", r"\bnice (-n )?19\b", r"\b20\d\d-\d\d-\d\d\b",
         r"\b\d\d:\d\d UTC\b", r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b"]


def test_docs_hold_results_not_a_diary():
    """Dates, load averages, commit hashes and issue numbers belong in benchmarks/README.md
    (the log) and in commits, not in the README, ARCHITECTURE.md or docs/."""
    found = []
    for doc in DOCS[:-1]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            found += [f"{doc.relative_to(ROOT)}:{n}: {m.group(0)!r}" for pattern in DIARY
                      for m in re.finditer(pattern, line, flags=re.I)]
    assert not found, "\n".join(found)
