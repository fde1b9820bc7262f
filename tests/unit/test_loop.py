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


def test_an_empty_incremental_assignment_never_reaches_the_runner() -> None:
    # A runner's take-over asks the coordinator for committed offsets; for an empty list that request timed out
    # in a busy group and held the process inside the callback past SIGTERM.
    loop = RecordingLoop()
    loop._assigned(None, [])
    loop._assigned(None, [TopicPartition("in", 2)])
    assert loop.assigned == [[2]]
