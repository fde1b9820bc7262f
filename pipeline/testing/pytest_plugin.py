"""A pytest fixture for your own tests: `pipeline_driver(app, **options)` makes an AppDriver (testing/driver.py).

Enable it in your conftest.py with `pytest_plugins = ["pipeline.testing.pytest_plugin"]`, or import the fixture
into a test module: `from pipeline.testing.pytest_plugin import pipeline_driver`.

    def test_totals(pipeline_driver):
        driver = pipeline_driver(app)
        assert driver.send("acct-1", {"id": 1, "amount": 5})[0].value == {"id": 1, "count": 1, "sum": 5}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.app import App
from pipeline.testing.driver import AppDriver


@pytest.fixture
def pipeline_driver() -> Callable[..., AppDriver]:
    """AppDriver(app, partitions=1, wall_clock_ms=0, auto_commit=True, strict=True, on_stop="raise", **settings) for
    this test: strict by default (a state value changed in place but not assigned back is an error), and a partition
    stopped as the runtime stops it raises PartitionStopped from the call (on_stop="record": the runtime's behaviour,
    `driver.stopped` and a failing `verify()`)."""

    def make(app: App, **options: Any) -> AppDriver:
        return AppDriver(app, **{"strict": True, **options})

    return make
