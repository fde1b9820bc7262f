"""`pytest -m "not kafka"` (make test-fast) is the suite that needs no server: every test that needs one is marked
`kafka` (tests/plugins/servers.py), and a server fixture is never set up for a test that is not.

The suite is collected afresh in a child pytest, whatever this run selected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.servers import SERVER_DIRS, SERVER_FIXTURES, SERVER_MARKERS

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "tests.plugins.inventory"


def collected(inventory: Path, *args: str) -> dict[str, list[dict]]:
    """The tests `pytest --collect-only *args` selects and deselects: id, every fixture each gets, its markers."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, *args],
        cwd=REPO,
        env={**os.environ, "PYTEST_INVENTORY": str(inventory)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(inventory.read_text())


def test_no_test_of_the_fast_suite_needs_a_server(tmp_path: Path) -> None:
    """Collected with -m "not kafka" (so the marking must also come before pytest deselects by marker): no test left
    gets a server fixture, lives in a server directory or carries a server's marker."""
    suite = collected(tmp_path / "inventory.json", "-m", "not kafka")
    fast, servers = suite["selected"], suite["deselected"]
    reasons = {
        test["id"]: sorted(set(test["fixtures"]) & SERVER_FIXTURES)
        + [f"in tests/{d}" for d in SERVER_DIRS if test["id"].startswith(f"tests/{d}/")]
        + [f"marked {m}" for m in set(test["markers"]) & SERVER_MARKERS]
        for test in fast
    }
    assert {test: why for test, why in reasons.items() if why} == {}
    assert servers and all("kafka" in test["markers"] for test in servers)  # deselected by the marker


UNMARKED = """
import pytest

def test_asks_at_run_time(request):
    request.getfixturevalue("kafka_bootstrap")

@pytest.mark.kafka
def test_marked(request):
    request.getfixturevalue("kafka_bootstrap")
"""

STAND_IN = """
import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.plugins.servers"]

def pytest_configure(config):
    config.addinivalue_line("markers", "kafka: needs real servers")

@pytest.fixture(scope="session")
def kafka_bootstrap():
    Path(os.environ["STARTED"]).write_text("a broker would start here")
    return "127.0.0.1:1"
"""


@pytest.mark.parametrize("selected", ["test_asks_at_run_time", "test_marked"])
def test_a_server_fixture_is_set_up_only_for_a_test_marked_kafka(tmp_path: Path, selected: str) -> None:
    """The marking sees the fixtures a test declares; one asked for at run time (request.getfixturevalue) is caught
    when it is set up: for an unmarked test the run ends before the fixture starts anything (a stand-in here that
    leaves a file where a broker would start), for a marked one it is set up."""
    (tmp_path / "conftest.py").write_text(STAND_IN)
    (tmp_path / "test_servers.py").write_text(UNMARKED)
    started = tmp_path / "started"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"test_servers.py::{selected}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "STARTED": str(started)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if selected == "test_marked":
        assert (result.returncode, started.exists()) == (0, True), result.stdout
    else:
        assert (result.returncode, started.exists()) == (1, False), result.stdout
        assert "test_asks_at_run_time asks for kafka_bootstrap (a server) but is not marked kafka" in result.stdout
