"""`make test` (what CI runs, .ci/run) lints before it tests: ruff, the import layers, the format and mypy, strict
for the shipped packages. These read the Makefile and pyproject.toml, so the gate cannot be dropped unnoticed; the
checks themselves run in `make lint`."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _recipe(makefile: str, target: str) -> list[str]:
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match is not None, f"no target {target!r} with a recipe"
    return [line.strip() for line in match.group(1).splitlines()]


def test_make_lint_runs_ruff_the_layers_the_format_and_mypy() -> None:
    lint = _recipe((REPO / "Makefile").read_text(), "lint")
    for command in (
        ".venv/bin/ruff check .",
        ".venv/bin/lint-imports",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy",
    ):
        assert command in lint, f"make lint does not run {command!r}"


def test_make_test_lints_before_the_tests() -> None:
    test = _recipe((REPO / "Makefile").read_text(), "test")
    # The lint runs beside the registry's build, and a failed lint ends the recipe before the tests.
    lint_at = next(i for i, line in enumerate(test) if re.match(r"\$\(MAKE\)( --no-print-directory)? lint\b", line))
    assert re.search(r"lint( \|\| \{.*exit 1; \}.*)?$", test[lint_at]), test[lint_at]
    assert lint_at < next(i for i, line in enumerate(test) if line.startswith("tests/run.sh"))


def test_mypy_is_strict_for_the_shipped_packages_and_pinned_to_the_version_installed() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    mypy = project["tool"]["mypy"]
    assert mypy["strict"] is True
    assert {"pipeline", "snapshots"} <= set(mypy["files"])
    relaxed = {m for o in mypy.get("overrides", []) for m in o["module"] if o.get("disallow_untyped_defs") is False}
    assert not any(m.split(".")[0] in {"pipeline", "snapshots"} for m in relaxed), relaxed
    # The version the lint gate runs is the one the lock pins (a newer mypy may report new errors).
    assert any(r.startswith("mypy") for r in project["project"]["optional-dependencies"]["dev"])
    assert f"mypy=={version('mypy')} " in (REPO / "requirements" / "dev.txt").read_text()
