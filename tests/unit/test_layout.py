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
