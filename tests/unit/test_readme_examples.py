"""README's driver examples run as written: each ```python block of README.md that uses `pipeline_driver` is
executed as a test module, so the README cannot drift from the API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.testing.driver import AppDriver

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL) if "pipeline_driver" in b]


def test_the_readme_has_the_driver_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example-{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(block: str) -> None:
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)  # the README's own code
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test(lambda app, **options: AppDriver(app, **options))
