"""`pytest --collect-only -p tests.plugins.inventory`: writes the tests collected and those deselected (-m, -k), each
with every fixture it gets and its markers, as JSON to the file named by $PYTEST_INVENTORY (for
tests/unit/test_markers.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_deselected: list[pytest.Item] = []


def _described(items: list[pytest.Item]) -> list[dict[str, Any]]:
    return [
        {
            "id": item.nodeid,
            "fixtures": sorted(getattr(item, "fixturenames", ())),
            "markers": sorted({mark.name for mark in item.iter_markers()}),
        }
        for item in items
    ]


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    inventory = {"selected": _described(session.items), "deselected": _described(_deselected)}
    Path(os.environ["PYTEST_INVENTORY"]).write_text(json.dumps(inventory))
