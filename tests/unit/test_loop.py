"""The poll loop shared by both runners: what reaches a runner's rebalance callbacks."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from pipeline.core.loop import PollLoop
from pipeline.settings import Settings


class RecordingLoop(PollLoop):
    def __init__(self) -> None:
        super().__init__(Settings())
        self.assigned: list[list[int]] = []

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        self.assigned.append([tp.partition for tp in partitions])


class Member:
    """What the rebalance callback asks of the consumer: its member id."""

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id

    def memberid(self) -> str:
        return self.member_id


def test_an_empty_incremental_assignment_never_reaches_the_runner() -> None:
    # A runner's take-over asks the coordinator for committed offsets; for an empty list that request timed out
    # in a busy group and held the process inside the callback past SIGTERM.
    loop = RecordingLoop()
    loop._assigned(Member("m-1"), [])
    loop._assigned(Member("m-1"), [TopicPartition("in", 2)])
    assert loop.assigned == [[2]]


def test_every_join_tells_the_member_id_from_the_consumers_own_thread() -> None:
    """FAILURE_DETECTION_MS's heartbeat names the member (pipeline/kafka/liveness.py: Liveness.joined): told from the
    rebalance callback, even when a join brings no partition, because another thread asking memberid() waits for the
    loop's poll."""
    loop, told = RecordingLoop(), []
    loop.on_join = told.append
    loop._assigned(Member("m-1"), [])
    loop._assigned(Member("m-2"), [TopicPartition("in", 0)])  # rejoined after a removal: a new member id
    assert told == ["m-1", "m-2"]


def test_an_assignment_served_after_the_stop_was_asked_is_not_taken_over() -> None:
    """The consumer's close() serves an assignment that waited in it: taken over there, the take-over's offsets read
    timed out and SIGTERM ended the process with code 1 (tests/integration/test_stop_during_rebalance.py)."""
    loop, told = RecordingLoop(), []
    loop.on_join = told.append
    loop.stop()
    loop._assigned(Member("m-1"), [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert loop.assigned == []
    assert told == ["m-1"]  # the heartbeat still names the member
