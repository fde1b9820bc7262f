"""The layout is the architecture: these limits keep the shipped code readable. The import layers themselves are
checked by `lint-imports` (contracts in pyproject.toml), which `make test` runs before pytest."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("pipeline", "snapshots")  # what `pip install .` installs
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60


def _shipped_files() -> list[Path]:
    return sorted(f for package in SHIPPED for f in (ROOT / package).rglob("*.py"))


def test_no_shipped_file_is_longer_than_the_limit() -> None:
    too_long = {
        str(f.relative_to(ROOT)): n for f in _shipped_files() if (n := len(f.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not too_long, f"files over {MAX_FILE_LINES} lines: {too_long}"


def test_no_shipped_function_is_longer_than_the_limit() -> None:
    too_long = {}
    for f in _shipped_files():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long[f"{f.relative_to(ROOT)}:{node.name}"] = length
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_the_wheel_holds_only_the_shipped_packages() -> None:
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(found["include"]) == sorted(f"{p}*" for p in SHIPPED)
    assert not (ROOT / "pipeline" / "peers").exists() and not (ROOT / "pipeline" / "bench.py").exists()


def import_cycles(*packages: str) -> list[list[str]]:
    """Every circle of modules importing each other (strongly connected components of more than one module, or a
    module importing itself), over the imports grimp finds: top-level and inside functions alike."""
    import grimp

    graph = grimp.build_graph(*packages, include_external_packages=False, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in edges.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in edges.get(module, ()):
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_circles_in_the_runtime_the_compaction_job_or_the_tools() -> None:
    assert import_cycles("pipeline", "snapshots", "tools") == []


def test_the_circle_finder_finds_a_circle(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "circular"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circular import b\n")
    (package / "b.py").write_text("def f():\n    from circular import a\n")  # inside a function counts too
    (package / "c.py").write_text("from circular import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("circular") == [["circular.a", "circular.b"]]
