"""The broker-free test driver (pipeline/testing/driver.py) and its pytest fixture: what the README shows, and that it
is the production code path (transactions, crash and restore, the checker)."""

from __future__ import annotations

import pytest

from pipeline.examples.running_totals import app as running_totals
from pipeline.examples.windowed_totals import app as windowed_totals
from pipeline.sinks.kafka.commit import commit_transaction
from pipeline.sinks.kafka.transaction import PartitionDropped
from pipeline.testing.driver import AppDriver
from pipeline.testing.pytest_plugin import pipeline_driver  # noqa: F401 - the fixture, as users import it

pytestmark = pytest.mark.usefixtures("state_store")  # every driver on both stores (tests/unit/conftest.py)


# The README's two examples, as they are printed there.
def test_running_totals(pipeline_driver):  # noqa: F811
    driver = pipeline_driver(running_totals)
    driver.send("acct-1", {"id": 1, "amount": 5})
    out = driver.send("acct-1", {"id": 2, "amount": 7})
    assert out[0].value == {"id": 2, "count": 2, "sum": 12}
    driver.send_bytes(b"acct-1", b"not json")  # poison: retried, then dead-lettered
    assert driver.dead_letters[0].error_type == "SerdeError"
    assert driver.state() == {"acct-1": [2, 12]}


def test_windowed_totals(pipeline_driver):  # noqa: F811
    driver = pipeline_driver(windowed_totals)
    driver.send("acct-1", {"id": 1, "amount": 5}, timestamp_ms=1_000)
    driver.send("acct-1", {"id": 2, "amount": 7}, timestamp_ms=9_999)
    assert driver.send("acct-2", {"id": 3, "amount": 1}, timestamp_ms=11_999) == []  # window open until 12,000
    [closed] = driver.send("acct-2", {"id": 4, "amount": 1}, timestamp_ms=12_000)
    assert closed.value == {"window_start": 0, "window_end": 10_000, "count": 2, "sum": 12}
    driver.send("acct-1", {"id": 5, "amount": 3}, timestamp_ms=2_000)  # its window has closed
    assert driver.dead_letters[0].error_type == "late"


def test_a_crash_loses_only_what_was_not_committed_and_restores_the_state() -> None:
    driver = AppDriver(running_totals, auto_commit=False)
    driver.send("a", {"id": 1, "amount": 5})
    driver.commit()
    driver.send("a", {"id": 2, "amount": 7})
    driver.crash()  # the second record's transaction is lost, and it is processed again from the committed offset
    driver.commit()
    assert [o.value for o in driver.outputs] == [{"id": 1, "count": 1, "sum": 5}, {"id": 2, "count": 2, "sum": 12}]
    assert driver.committed_offset() == 2 and driver.verify().ok


def test_a_fenced_zombie_commits_nothing() -> None:
    driver = AppDriver(running_totals, auto_commit=False)
    driver.send("a", {"id": 1, "amount": 5})
    zombie = driver.tasks[0]
    driver.crash()  # a new owner fences the old producer
    driver.commit()
    with pytest.raises(PartitionDropped):
        commit_transaction(zombie.txn, driver.consumer)  # type: ignore[arg-type]
    assert len(driver.outputs) == 1 and driver.verify().ok


def test_injected_aborts_rewind_and_the_run_stays_exactly_once() -> None:
    driver = AppDriver(running_totals, partitions=2, test_abort_every=2)
    for i in range(50):
        driver.send(f"acct-{i % 7}", {"id": i, "amount": i})
    assert len(driver.outputs) == 50 and driver.verify().ok
