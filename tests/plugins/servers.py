"""Which tests need real servers: every one is marked `kafka`, so that `pytest -m "not kafka"` (make test-fast) is
the suite that runs with no server at all, and none is ever started for a test that is not marked.

A test needs servers when it asks for a server fixture (directly or through another fixture: fault_run, pg_run,
new_topic ...), lives in a directory whose every test is about servers, or carries a marker that names one.
tests/unit/test_markers.py checks the whole suite against this.

A plugin rather than hooks in tests/conftest.py: a conftest's hooks are called only for the nodes below it, and a
session-scoped fixture is set up for the session, so a conftest would never see a broker being started."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SERVER_FIXTURES = frozenset(
    {
        *("kafka_bootstrap", "kafka_cluster", "kafka_secure", "postgres_dsn", "spark", "engine"),
        *("schema_registry", "private_schema_registry"),
    }
)
SERVER_DIRS = frozenset({"infra", "integration", "faults", "postgres", "security", "image"})
SERVER_MARKERS = frozenset({"cluster", "secure", "postgres", "spark", "image"})


def needs_servers(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))  # every fixture the test gets, however indirectly
    directory = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else None
    markers = {mark.name for mark in item.iter_markers()}
    return bool(fixtures & SERVER_FIXTURES or directory in SERVER_DIRS or markers & SERVER_MARKERS)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_servers(item):
            item.add_marker(pytest.mark.kafka)
        if item.path.is_relative_to(TESTS / "faults"):
            item.add_marker(pytest.mark.faults)  # tests/run.sh gives them lanes of their own


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> None:
    """A server fixture about to be set up for a test not marked `kafka` (one that asks for it with
    request.getfixturevalue, which the marking cannot see) ends the run instead of starting a server. Ends it rather
    than failing the one test: a session fixture whose setup raised outside pytest's own hook breaks the next ones."""
    item = request._pyfuncitem  # the test being set up, also when the fixture is session-scoped
    if fixturedef.argname in SERVER_FIXTURES and item.get_closest_marker("kafka") is None:
        reason = f"{item.nodeid} asks for {fixturedef.argname} (a server) but is not marked kafka: mark it"
        pytest.exit(reason, returncode=pytest.ExitCode.TESTS_FAILED)
