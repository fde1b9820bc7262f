"""State versions: values tagged with the version that wrote them, migrated at restore, a newer state refused
(pipeline/state/versions.py), through KafkaTask with the test driver."""

from __future__ import annotations

import pytest

from pipeline.state.versions import StateVersionError, current_value, tag, untag
from pipeline.testing.driver import AppDriver, PartitionStopped
from tests.snapshots.versioned_app import v1, v2


def test_tags_carry_the_version_and_version_one_has_none() -> None:
    assert tag(1, b"[1,2]") == b"[1,2]" and untag(b"[1,2]") == (1, b"[1,2]")
    assert untag(tag(12, b'{"a":1}')) == (12, b'{"a":1}')
    assert current_value(b"[3,4]", 2, v2.state_serde, v2.migrate, "k") == b'{"count":3,"sum":4}'
    with pytest.raises(StateVersionError, match="no migrate"):
        current_value(b"[3,4]", 2, v1.state_serde, None, "k")


def totals(driver: AppDriver, *records: tuple[str, int]) -> list[dict]:
    return [out.value for key, amount in records for out in driver.send(key, {"id": 0, "amount": amount})]


def test_a_new_state_version_migrates_at_restore_and_outputs_continue_exactly() -> None:
    driver = AppDriver(v1, partitions=2, test_abort_every=3)
    totals(driver, ("a", 1), ("b", 10), ("a", 2))
    driver.deploy(v2)  # restored from v1's changelog, migrated
    assert driver.state(0) | driver.state(1) == {"a": {"count": 2, "sum": 3}, "b": {"count": 1, "sum": 10}}
    assert totals(driver, ("a", 5), ("b", 1)) == [{"id": 0, "count": 3, "sum": 8}, {"id": 0, "count": 2, "sum": 11}]
    changelog = {(r.key, r.value) for r in driver.broker.committed_records(driver.changelog_topic)}
    assert (b"a", b'\xffv2:{"count":3,"sum":8}') in changelog and (b"__eos.state_version", b"2") in changelog
    driver.deploy(v2)  # a restore of mixed versions: b's and a's latest are v2, older v1 records folded under them
    assert driver.verify().ok  # against v2 from scratch: the same outputs and (migrated) state


def test_state_written_by_a_newer_version_refuses_to_start() -> None:
    driver = AppDriver(v1)
    totals(driver, ("a", 1))
    driver.deploy(v2)
    totals(driver, ("a", 1))
    with pytest.raises(
        PartitionStopped, match=r"p0: STOPPED at its restore: .*written by state version 2, this code is at version 1"
    ) as stopped:
        driver.deploy(v1)  # a rollback
    assert isinstance(stopped.value.__cause__, StateVersionError)
