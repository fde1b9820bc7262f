"""The schedule (pipeline/core/schedule.py): the tasks tell the poll loop when a batch opens or fills and when a
partition waits for a seek, so that a loop turn costs the same at 3 and at 384 partitions (issue 23). No broker."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.core.schedule import Schedule
from pipeline.core.task import Task
from pipeline.examples.copier import app as copier
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from tests.fakes import FakeClock, FeedConsumer, NullProducer, kafka_exception
from tests.harness import kafka_runner


class Owned(Lifecycle):
    def __init__(self, partition: int, schedule: Schedule) -> None:
        super().__init__()
        self.partition, self.next_offset, self.schedule = partition, None, schedule

    def _transition(self, to: Phase) -> None:
        super()._transition(to)
        self.schedule.moved(self)


def test_due_an_interval_after_the_first_batch_opened_or_at_once_when_one_is_full() -> None:
    schedule = Schedule(interval_ms=100, max_records=10)
    assert schedule.deadline() is None
    schedule.opened(5.0)
    schedule.opened(5.03)
    assert schedule.deadline() == pytest.approx(5.1)
    schedule.filled()
    assert schedule.deadline() == pytest.approx(5.0)
    schedule.restart()
    assert schedule.deadline() is None


def test_waiting_gives_the_owned_tasks_in_the_phases_asked_and_forgets_the_others() -> None:
    schedule = Schedule(100, 10)
    tasks = {p: Owned(p, schedule) for p in range(4)}
    for task in tasks.values():
        task._transition(Phase.RESTORING)
    tasks[1]._transition(Phase.RUNNING)  # restored: needs records only
    tasks[1]._transition(Phase.REWINDING)  # ... and its seek is pending
    tasks[2]._transition(Phase.CLOSED)
    replaced = tasks[3]
    tasks[3] = Owned(3, schedule)  # a new task of p3: the old one is not the loop's any more
    assert schedule.waiting((Phase.RESTORING,), tasks) == [tasks[0]]
    assert schedule.waiting((Phase.REWINDING,), tasks) == [tasks[1]]
    assert replaced not in schedule._waiting and tasks[2] not in schedule._waiting


def runner_with_open_batches(partitions: int) -> KafkaRunner:
    clock = FakeClock()
    producer = NullProducer(clock)
    runner = kafka_runner(
        copier,
        FeedConsumer(clock),
        lambda _: producer,
        app_id="schedule",
        commit_interval_ms=5_000,  # nothing gets due while the test runs
        producers="per_process",
    )
    for p in range(partitions):
        task = KafkaTask(runner.ctx, p, runner._transaction_for(p))
        runner.tasks[p] = task
        task.start(0)
        task._begin()  # a batch open on every partition, as while a backlog drains
    runner._next_gauge_update = float("inf")  # the gauges look at every partition once a second, by design
    return runner


def test_an_idle_turn_asks_no_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    # Red before the schedule: each turn asked every task for its commit deadline (twice) and its phase (twice).
    runner = runner_with_open_batches(384)
    asked: list[str] = []
    commit_deadline, phase = Task.commit_deadline, Lifecycle.__dict__["phase"]

    def counted_deadline(self: Task) -> float | None:
        asked.append("commit_deadline")
        return commit_deadline(self)

    def counted_phase(self: Lifecycle) -> Phase:
        asked.append("phase")
        return phase.fget(self)  # type: ignore[no-any-return]

    monkeypatch.setattr(Task, "commit_deadline", counted_deadline)
    monkeypatch.setattr(Lifecycle, "phase", property(counted_phase, phase.fset))
    for _ in range(10):
        runner._loop_once()
    assert asked == []


def test_a_pending_seek_is_retried_every_turn_until_it_succeeds() -> None:
    runner = runner_with_open_batches(3)
    consumer: Any = runner.consumer
    failures = [kafka_exception(KafkaError._STATE)] * 2

    def seek(tp: Any) -> None:
        if failures:
            raise failures.pop()

    consumer.seek = seek
    task = runner.tasks[1]
    task.txn.end()
    task.rewind()  # aborted: back to the committed offset, the seek fails twice
    phases = [task.phase]
    runner._loop_once()
    phases.append(task.phase)
    assert not failures, "the seek was not tried again"
    runner._loop_once()
    phases.append(task.phase)
    assert phases == [Phase.REWINDING, Phase.REWINDING, Phase.RUNNING]
