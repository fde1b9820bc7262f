"""State versions: values tagged with the version that wrote them, migrated at restore (on disk: as they are read), a
newer state refused (pipeline/state/versions.py), through KafkaTask with the test driver on both stores, and the disk
store's own: a restart from the local store, a snapshot from disk, a rollback."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from pipeline.app import App, Output, Record, State
from pipeline.serde import JSON
from pipeline.settings import Settings
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint
from pipeline.state.disk_store import DiskBacked, note_committed, ready_state
from pipeline.state.local_stores import LocalStores
from pipeline.state.timed import restored_state
from pipeline.state.versions import VERSION_KEY, StateVersionError, current_value, tag, untag
from pipeline.testing.driver import AppDriver, PartitionStopped
from tests.snapshots.versioned_app import v1, v2

on_both_stores = pytest.mark.usefixtures("state_store")  # the driver on memory and disk (tests/unit/conftest.py)


def test_tags_carry_the_version_and_version_one_has_none() -> None:
    assert tag(1, b"[1,2]") == b"[1,2]" and untag(b"[1,2]") == (1, b"[1,2]")
    assert untag(tag(12, b'{"a":1}')) == (12, b'{"a":1}')
    assert current_value(b"[3,4]", 2, v2.state_serde, v2.migrate, "k") == b'{"count":3,"sum":4}'
    with pytest.raises(StateVersionError, match="no migrate"):
        current_value(b"[3,4]", 2, v1.state_serde, None, "k")


def totals(driver: AppDriver, *records: tuple[str, int]) -> list[dict]:
    return [out.value for key, amount in records for out in driver.send(key, {"id": 0, "amount": amount})]


@on_both_stores
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


@on_both_stores
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


# -- STATE_STORE=disk: values kept as the changelog has them, migrated when read (pipeline/state/disk_store.py) --
V1_TOTALS = {"a": [2, 3], "b": [1, 10]}
MIGRATED = {"a": {"count": 2, "sum": 3}, "b": {"count": 1, "sum": 10}}


def commit_disk(state: PartitionState, data: dict[str, object], offset: int) -> dict[str, bytes | None]:
    """One record's writes committed as the sink does: changes() for the changelog, then the disk's batch (with the
    changelog offset it reaches). Returns what went to the changelog."""
    state.begin_record()
    for key, value in data.items():
        state[key] = value
    changes = dict(state.changes())
    note_committed(state, 1, (1, offset - 1, Checkpoint("in", 0, offset)))
    state.commit()
    return changes


def restart(settings: Settings, app: App) -> tuple[LocalStores, PartitionState]:
    """A new process on the same STATE_DIR: p0's store is the base of its restore (the changelog after it is empty
    here), then KafkaTask.restored's ready_state for `app`."""
    stores = LocalStores(settings, "app")
    base, copy = stores.base(0, JSON)
    assert copy is not None, "the store recorded its changelog offset: a restart reads only the tail after it"
    return stores, ready_state(app, base, "p0")


def test_on_disk_a_restart_from_the_local_store_migrates_older_values_as_they_are_read(tmp_path: Path) -> None:
    settings = Settings(state_store="disk", state_dir=str(tmp_path), state_block_cache_mb=8)
    stores = LocalStores(settings, "app")
    old = ready_state(v1, stores.base(0, JSON)[0], "p0")
    commit_disk(old, V1_TOTALS, offset=10)
    stores.close()

    stores, state = restart(settings, v2)  # new code, the v1 values still on the disk
    store = cast(DiskBacked, state).store
    assert store.get("a") == b"[2,3]"  # not rewritten at the restart...
    assert {key: state[key] for key in state} == MIGRATED  # ...migrated when read
    assert state.committed_get("b") == b'{"count":1,"sum":10}'  # interactive queries: the same
    assert state.committed_range("", 10) == [("a", b'{"count":2,"sum":3}'), ("b", b'{"count":1,"sum":10}')]
    changes = commit_disk(state, {"a": {"count": 3, "sum": 8}}, offset=12)
    tagged = b'\xffv2:{"count":3,"sum":8}'
    assert changes == {"a": tagged, VERSION_KEY: b"2"}
    assert store.get("a") == tagged and store.get(VERSION_KEY) == b"2"  # on disk as in the changelog
    assert state.get("a") == {"count": 3, "sum": 8} and state.committed_get("a") == b'{"count":3,"sum":8}'
    stores.close()


def test_on_disk_a_snapshot_carries_each_value_tagged_as_written_and_restores_on_both_stores(tmp_path: Path) -> None:
    settings = Settings(state_store="disk", state_dir=str(tmp_path), state_block_cache_mb=8)
    stores = LocalStores(settings, "app")
    commit_disk(ready_state(v1, stores.base(0, JSON)[0], "p0"), V1_TOTALS, offset=10)
    stores.close()
    stores, state = restart(settings, v2)
    commit_disk(state, {"a": {"count": 3, "sum": 8}}, offset=12)
    state.begin_record()
    state["c"] = {"count": 1, "sum": 1}  # held, not committed: a snapshot's entries include it, tagged
    entries = dict(state.encoded_items())
    state.undo_transaction()
    snapshot = dict(state.encoded_items())  # a shutdown snapshot's: RocksDB's entries as they are
    assert snapshot == {"a": b'\xffv2:{"count":3,"sum":8}', "b": b"[1,10]", VERSION_KEY: b"2"}
    assert entries == {**snapshot, "c": b'\xffv2:{"count":1,"sum":1}'}
    stores.close()

    memory = PartitionState(JSON)  # read back by a restore on the memory store...
    memory.load(dict(snapshot))  # a copy: a restore takes over the dict it is given
    restored = restored_state(v2, memory, "p0")
    assert {key: restored[key] for key in restored} == {**MIGRATED, "a": {"count": 3, "sum": 8}}
    other = LocalStores(Settings(state_store="disk", state_dir=str(tmp_path / "other")), "app")
    into, _ = other.base(0, JSON)  # ...and on a disk store of another process
    into.load(snapshot)
    into.store.mark(12, None, None)
    on_disk = ready_state(v2, into, "p0")
    assert {key: on_disk[key] for key in on_disk} == {**MIGRATED, "a": {"count": 3, "sum": 8}}
    with pytest.raises(StateVersionError, match="written by state version 2, this code is at version 1"):
        ready_state(v1, into, "p0")
    other.close()


def test_on_disk_state_a_newer_version_wrote_refuses_older_code_at_the_restart(tmp_path: Path) -> None:
    settings = Settings(state_store="disk", state_dir=str(tmp_path), state_block_cache_mb=8)
    stores = LocalStores(settings, "app")
    commit_disk(ready_state(v2, stores.base(0, JSON)[0], "p0"), {"a": {"count": 1, "sum": 1}}, offset=5)
    stores.close()
    stores = LocalStores(settings, "app")
    base, _ = stores.base(0, JSON)
    with pytest.raises(StateVersionError, match=r"p0: .*written by state version 2, this code is at version 1"):
        ready_state(v1, base, "p0")  # a rollback: one read of __eos.state_version, no scan
    stores.close()


def keep(state: State, record: Record) -> list[Output]:
    state[record.key] = record.value
    return []


@on_both_stores
def test_a_failing_migrate_met_by_a_ttl_expiry_stops_the_partition_with_nothing_of_it_committed(
    state_store: str,
) -> None:
    """On disk a TTL expiry reads the expired value (for its undo) and so migrates it: a migrate that fails there stops
    p as a failing `process` read would, the expiry undone; in memory the restore met it already."""
    old = App("ttl", "in", "out", keep, state_ttl_ms=1_000)
    driver = AppDriver(old)
    driver.send("a", {"n": 1}, timestamp_ms=0)
    broken = replace(old, state_version=2, migrate=lambda version, value: None)
    with pytest.raises(PartitionStopped, match=r"migrate\(1, value of state key 'a'\) returned None"):
        driver.deploy(broken)
        driver.send("b", {"n": 2}, timestamp_ms=5_000)  # on disk: "a" expires before "b", and its value is read
    changelog = [r.key for r in driver.broker.committed_records(driver.changelog_topic)]
    assert b"b" not in changelog and changelog.count(b"a") == changelog.count(b"__eos.ttl/a") == 1  # none committed
