"""Standby copies without a broker (pipeline/state/standby.py): where copies are placed, how a followed batch moves
a copy (state, position, checkpoint; on both stores), that records deleted under a copy drop it, STANDBY_REPLICAS'
bounds, and a copy on disk (STATE_STORE=disk): each followed batch one atomic write with the offset it reaches."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

import pipeline.state.standby as standby_module
from pipeline.kafka.kafka_python import GroupAnswer, GroupMember
from pipeline.serde import JSON
from pipeline.settings import ConfigError, Settings
from pipeline.state import PartitionState
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.state.disk_store import DiskPartitionState, DiskStore, StoreMemory
from pipeline.state.restore import StandbyCopy
from pipeline.state.standby import Standbys, standby_partitions
from tests.fakes import kafka_message
from tests.unit.conftest import make_state

MEMORY = StoreMemory(8, 8)

OWNERS = {"a": [0, 1], "b": [2, 3], "c": [4, 5]}


def test_each_member_copies_the_partitions_of_the_k_members_before_it() -> None:
    assert standby_partitions(OWNERS, "b", 1) == {0, 1}
    assert standby_partitions(OWNERS, "a", 1) == {4, 5}  # a ring: the first copies the last
    assert standby_partitions(OWNERS, "a", 2) == {2, 3, 4, 5}
    assert standby_partitions({"a": [0, 1], "b": [2]}, "b", 1) == {0, 1}


def test_never_more_copies_than_other_members_never_its_own_and_none_when_not_found() -> None:
    assert standby_partitions(OWNERS, "a", 5) == {2, 3, 4, 5}
    assert standby_partitions({"a": [0, 1, 2]}, "a", 1) == set()
    assert standby_partitions(OWNERS, "stranger", 1) == set()
    assert standby_partitions(OWNERS, "a", 0) == set()


def test_every_copy_of_a_partition_sits_on_a_different_member() -> None:
    owners = {f"m{i}": [2 * i, 2 * i + 1] for i in range(5)}
    for k in (1, 2, 4):
        placed = [p for me in owners for p in standby_partitions(owners, me, k)]
        assert sorted(placed) == sorted(p for p in range(10) for _ in range(k))


class _NullConsumer:
    def incremental_assign(self, partitions: Any) -> None: ...

    def incremental_unassign(self, partitions: Any) -> None: ...

    def close(self) -> None: ...


def _standbys(state: PartitionState | None = None) -> Standbys:
    standbys = Standbys(1, "cl", None, _NullConsumer, None, lambda: "")  # type: ignore[arg-type]
    standbys._follower = _NullConsumer()  # type: ignore[assignment]
    standbys.copies[0] = StandbyCopy(0, PartitionState(JSON) if state is None else state, 10, None, None)
    return standbys


def _contents(state: PartitionState) -> dict[str, bytes]:
    return dict(state._data.items())


def _change(offset: int, key: str, value: bytes | None, partition: int = 0) -> Message:
    return kafka_message(offset, key.encode(), value, partition=partition, topic="cl")


def _checkpoint(offset: int, next_input: int) -> Message:
    value = Checkpoint("in", 0, next_input).encode()
    return kafka_message(offset, CHECKPOINT_KEY, value, topic="cl", headers=[CHECKPOINT_HEADER])


def test_a_followed_batch_moves_the_copy_its_state_position_and_checkpoint(state_store: str) -> None:
    standbys = _standbys(make_state())
    standbys._apply([_change(10, "x", b"1"), _change(11, "y", b"2"), _checkpoint(12, 500), _change(14, "x", None)])
    copy = standbys.copies[0]
    assert _contents(copy.state) == {"y": b"2"} and copy.position == 15 and len(copy.state) == 1
    assert copy.last_checkpoint == Checkpoint("in", 0, 500)
    standbys._apply([_change(9, "z", b"old"), _change(15, "z", b"3"), _change(16, "w", b"4", partition=7)])
    assert _contents(copy.state) == {"y": b"2", "z": b"3"} and copy.position == 16  # p7 is no copy here
    assert copy.last_checkpoint == Checkpoint("in", 0, 500) and len(copy.state) == 2  # no checkpoint: the last one


def _disk_copy(path: Path) -> tuple[Standbys, DiskStore]:
    store = DiskStore(path, MEMORY)
    store.mark(10, None, None)  # warmed up: covers the changelog below 10
    return _standbys(DiskPartitionState(store, JSON)), store


def test_a_copy_on_disk_records_each_followed_batch_with_the_offset_it_reaches_and_a_reopened_store_finds_both(
    tmp_path: Path,
) -> None:
    standbys, store = _disk_copy(tmp_path / "p0")
    standbys._apply([_change(10, "x", b"1"), _change(11, "y", b"2"), _checkpoint(12, 500), _change(14, "x", None)])
    standbys._apply([_change(15, "z", b"3")])
    store.close()
    again = DiskStore(tmp_path / "p0", MEMORY)  # what a restart or a promotion finds
    assert dict(again.items()) == {"y": b"2", "z": b"3"}
    assert (again.position, again.checkpoint, again.count) == (16, Checkpoint("in", 0, 500), 2)
    again.close()


def test_a_followed_batch_the_disk_refuses_leaves_data_and_offset_as_they_were_and_drops_the_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash (or a full disk) in the middle of a followed batch: the store keeps the previous batch's data AND
    offset, never an offset ahead of its data (a promotion would then skip changes)."""
    standbys, store = _disk_copy(tmp_path / "p0")
    standbys._apply([_change(10, "x", b"1"), _checkpoint(11, 500)])
    db = store.db

    class RefusesChanges:  # the disk fails the write of any batch that carries state keys
        def __getattr__(self, name: str) -> object:
            return getattr(db, name)

        def write(self, batch: Any) -> None:
            if batch.len() > 3:  # more than the bookkeeping (count, position, checkpoint)
                raise Exception("IO error: No space left on device")
            db.write(batch)

    store.db = RefusesChanges()  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR):
        standbys._apply([_change(12, "x", b"2"), _change(13, "y", b"3"), _change(14, "z", b"4"), _checkpoint(15, 9)])
    store.db = db
    assert "standby copy dropped" in caplog.text and str(tmp_path / "p0") in caplog.text and not standbys.copies
    store.close()
    again = DiskStore(tmp_path / "p0", MEMORY)
    assert dict(again.items()) == {"x": b"1"} and (again.position, again.checkpoint) == (12, Checkpoint("in", 0, 500))
    again.close()


def test_records_deleted_under_a_copy_drop_it() -> None:
    standbys = _standbys()
    counts: list[int] = []
    standbys._on_count = counts.append  # the gauge: told when the number of warm copies changes, not every turn
    error = Message(topic="cl", partition=0, error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE))
    standbys._apply([error])
    assert standbys.copies == {} and counts == [0]


def test_a_promotion_takes_the_copy_out_of_the_followed_ones() -> None:
    standbys = _standbys()
    copy = standbys.copies[0]
    assert standbys.take(0) is copy and standbys.copies == {} and standbys.take(0) is None


def test_standby_replicas_must_be_from_0_to_8() -> None:
    assert Settings(standby_replicas=2).standby_replicas == 2
    for bad in (-1, 9):
        with pytest.raises(ConfigError, match="STANDBY_REPLICAS"):
            Settings(standby_replicas=bad)


class _Answer:
    """The placement's future of the group's answer (GroupAdmin.describe), done."""

    def __init__(self, members: dict[str, list[int]]) -> None:
        self.answer: GroupAnswer = ("Stable", [GroupMember(name, "", frozenset(p)) for name, p in members.items()], 200)

    def done(self) -> bool:
        return True

    def result(self) -> GroupAnswer:
        return self.answer


def test_a_copy_whose_owner_just_died_is_kept_through_the_rebalance_and_dropped_once_placed_elsewhere() -> None:
    """Asked mid-rebalance, the group shows the dead member gone and its partitions owned by nobody: exactly when the
    copy is needed (a run dropped both copies there and restored 1 M keys in full). Once another member owns p and
    the copy belongs elsewhere, it goes."""
    standbys = _standbys()
    standbys._member_id = lambda: "b"
    standbys._warm_up = lambda p: _NullConsumer()  # type: ignore[assignment,return-value]  # p1 warms up, never done
    standbys._next_ask = float("inf")  # no new question: the answers below are handed in
    standbys._asked = _Answer({"a": [0, 1], "b": [2, 3]})  # type: ignore[assignment]
    standbys._place(owned=[2, 3])
    assert standbys.wanted == {0, 1} and 0 in standbys.copies and 1 in standbys.warming
    standbys._asked = _Answer({"b": [2, 3]})  # type: ignore[assignment]  # a died: 0 and 1 owned by nobody
    standbys._place(owned=[2, 3])
    assert standbys.wanted == set() and 0 in standbys.copies and 1 in standbys.warming
    standbys._asked = _Answer({"a": [2, 3], "b": [], "c": [0, 1]})  # type: ignore[assignment]  # c's: a copies them
    standbys._place(owned=[])
    assert standbys.wanted == {2, 3} and not standbys.copies.keys() & {0, 1} and not standbys.warming.keys() & {0, 1}


def test_at_most_a_few_copies_warm_up_at_once() -> None:
    """Each warm-up holds two consumers: at start-up every copy is placed at once (192 at 384 partitions)."""
    standbys = _standbys()
    standbys._member_id = lambda: "b"
    standbys._warm_up = lambda p: _NullConsumer()  # type: ignore[assignment,return-value]
    standbys._next_ask = float("inf")
    standbys._asked = _Answer({"a": list(range(100, 140)), "b": []})  # type: ignore[assignment]
    standbys._place(owned=[])
    assert len(standbys.warming) == standby_module.MAX_WARMING < len(standbys.wanted)
