"""The disk state store's own rules (issue 32; the State contract itself runs on both stores in test_state.py):
nothing uncommitted on disk, one batch per commit with the local checkpoint, the committed view for another thread,
what a restart trusts, one process per STATE_DIR."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from pipeline.serde import JSON
from pipeline.settings import ConfigError, Settings
from pipeline.state.changelog import Checkpoint
from pipeline.state.disk_store import DiskPartitionState, DiskStore, StoreFull, StoreMemory
from pipeline.state.local_stores import LocalStores, lock_directory

MEMORY = StoreMemory(8, 8)
CHECKPOINT = Checkpoint("in", 0, 42)
LOCK_IT = (  # a second process taking the lock
    "import pathlib, sys\nfrom pipeline.state.local_stores import lock_directory\n"
    "lock_directory(pathlib.Path(sys.argv[1]))"
)


def on_disk(store: DiskStore) -> dict[str, object]:
    """What RocksDB holds, read around the state's pending writes."""
    return {key: orjson.loads(value) for key, value in store.items()}


def committed(state: DiskPartitionState, data: dict[str, object], position: int | None = None) -> None:
    state.begin_record()
    for key, value in data.items():
        state[key] = value
    state.reached(1, None if position is None else (1, position - 1, CHECKPOINT))
    state.commit()


def test_nothing_uncommitted_reaches_the_disk_and_an_abort_leaves_it_as_it_was(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "p0", MEMORY)
    state = DiskPartitionState(store, JSON)
    committed(state, {"a": 1, "b": 2}, position=10)
    state.begin_record()
    state["a"] = 100
    del state["b"]
    state["c"] = 3
    assert dict(state) == {"a": 100, "c": 3} and len(state) == 2  # reads go through the open writes
    assert on_disk(store) == {"a": 1, "b": 2}  # the disk: the last commit only
    state.undo_transaction()
    assert on_disk(store) == {"a": 1, "b": 2} and dict(state) == {"a": 1, "b": 2} and len(state) == 2


def test_a_commit_writes_its_changes_with_the_local_checkpoint_and_a_reopened_store_finds_both(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "p0", MEMORY)
    state = DiskPartitionState(store, JSON)
    committed(state, {"a": 1, "b": 2}, position=10)
    committed(state, {"a": 5})  # its checkpoint's offset not reported: the local checkpoint stays (safe)
    store.close()
    again = DiskStore(tmp_path / "p0", MEMORY)
    assert on_disk(again) == {"a": 5, "b": 2}
    assert (again.position, again.checkpoint, again.count) == (10, CHECKPOINT, 2)


def test_the_committed_view_for_another_thread_never_shows_the_open_transaction(tmp_path: Path) -> None:
    state = DiskPartitionState(DiskStore(tmp_path / "p0", MEMORY), JSON)
    committed(state, {"acct-1": 1, "acct-2": 2, "other": 3})
    state.begin_record()
    state["acct-1"] = 10
    state["acct-3"] = 30
    del state["acct-2"]
    assert state.committed_get("acct-1") == b"1" and state.committed_get("acct-3") is None
    assert state.committed_range("acct-", 10) == [("acct-1", b"1"), ("acct-2", b"2")]
    assert state.committed_range("acct-", 1) == [("acct-1", b"1")]
    state.commit()
    assert state.committed_get("acct-1") == b"10" and state.committed_get("acct-2") is None
    assert state.committed_range("acct-", 10) == [("acct-1", b"10"), ("acct-3", b"30")]


def test_a_restart_trusts_a_store_only_with_its_recorded_offset_and_wipes_what_it_cannot_open(tmp_path: Path) -> None:
    settings = Settings(state_store="disk", state_dir=str(tmp_path), state_block_cache_mb=8)
    stores = LocalStores(settings, "app")
    state, copy = stores.base(0, JSON)
    assert copy is None  # a new store covers nothing
    state.load({"a": b"1"})  # a restore that never finished: no offset recorded
    state2, copy = stores.base(0, JSON)
    assert copy is None and len(state2) == 0  # wiped
    state2.load({"a": b"1"})
    state2.store.mark(7, CHECKPOINT, None)
    _, copy = stores.base(0, JSON)
    assert copy is not None and (copy.position, copy.last_checkpoint, len(copy.state)) == (7, CHECKPOINT, 1)
    stores.close()
    (tmp_path / "app" / "p0" / "CURRENT").write_bytes(b"garbage")  # a damaged store
    stores = LocalStores(settings, "app")
    state, copy = stores.base(0, JSON)
    assert copy is None and len(state) == 0
    stores.close()


def test_a_second_process_on_the_same_state_dir_fails_naming_it(tmp_path: Path) -> None:
    held = lock_directory(tmp_path)
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            LOCK_IT,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert second.returncode != 0
    assert f"STATE_DIR={tmp_path} is in use by another process" in second.stderr
    held.close()
    lock_directory(tmp_path).close()  # free again once the holder is gone


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"state_store": "rocks"}, "STATE_STORE must be memory or disk"),
        ({"state_store": "disk"}, "STATE_STORE=disk needs STATE_DIR"),
        ({"state_store": "disk", "state_dir": "/x", "state_block_cache_mb": 0}, "STATE_\\*_MB must be positive"),
    ],
)
def test_a_bad_state_store_setting_fails_at_start_up_naming_it(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings(**settings)  # type: ignore[arg-type]


def test_standby_copies_are_kept_on_disk_too() -> None:
    assert Settings(state_store="disk", state_dir="/x", standby_replicas=1).standby_replicas == 1


def test_a_disk_that_refuses_the_batch_stops_the_partition_at_its_next_record_naming_the_directory(
    tmp_path: Path,
) -> None:
    store = DiskStore(tmp_path / "p0", MEMORY)
    state = DiskPartitionState(store, JSON)
    committed(state, {"a": 1}, position=10)

    class FullDisk:  # RocksDB's answer when the disk is full
        def __getattr__(self, name: str) -> object:
            return getattr(db, name)

        def write(self, batch: object) -> None:
            raise Exception("IO error: No space left on device: While appending to file: 000004.log")

    db, store.db = store.db, FullDisk()  # type: ignore[assignment]
    committed(state, {"a": 2}, position=20)  # the sink committed; the disk batch fails, nothing raised here
    store.db = db
    assert on_disk(store) == {"a": 1} and store.position == 10  # behind, which the changelog makes safe
    with pytest.raises(StoreFull, match=f"the disk state store in {tmp_path / 'p0'} cannot be written"):
        state.begin_record()


def test_the_store_metrics_follow_its_writes(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    stores = LocalStores(Settings(state_store="disk", state_dir=str(tmp_path)), "app", registry)
    state, _ = stores.base(2, JSON)
    committed(state, {"a": 1, "b": 2}, position=33)
    assert registry.get_sample_value("pipeline_state_keys", {"partition": "2"}) == 2
    assert registry.get_sample_value("pipeline_state_local_checkpoint", {"partition": "2"}) == 33
    assert (registry.get_sample_value("pipeline_state_disk_bytes", {"partition": "2"}) or 0) > 0
    assert (registry.get_sample_value("pipeline_state_disk_free_bytes") or 0) > 0
    stores.close()


def test_the_stores_on_the_disk_are_opened_ahead_at_start_up_and_closed_with_the_rest(tmp_path: Path) -> None:
    settings = Settings(state_store="disk", state_dir=str(tmp_path), state_block_cache_mb=8)
    stores = LocalStores(settings, "app")
    for p in (0, 1):
        state, _ = stores.base(p, JSON)
        committed(state, {f"k{p}": p}, position=5)
    stores.close()
    again = LocalStores(settings, "app")  # a restart: both opened on threads of their own, before any assignment
    ahead = dict(again._opening)
    assert sorted(ahead) == [0, 1]
    assert again.store(1) is ahead[1].result() and again.store(1).count == 1
    again.close()  # p0, opened ahead and never asked for, closed too: RocksDB's lock on it released
    third = LocalStores(settings, "app")
    state, copy = third.base(0, JSON)
    assert copy is not None and on_disk(state.store) == {"k0": 0}  # opened, not wiped as a store it cannot open
    third.close()
