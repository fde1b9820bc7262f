"""How long the poll loop waits (no broker: the feeding consumer of tests/fakes.py on a fake clock).

The loop hands records over as soon as there are any (it never waits for a full batch), and never waits past the
moment the earliest open transaction is due: a transaction commits when it is due, not when a wait for records ends
(issue 11: the old `consume(poll_max_records, 0.1)` held every record up to 100 ms, whatever COMMIT_INTERVAL_MS).
"""

from __future__ import annotations

import random
import time as real_time
from types import SimpleNamespace

import pytest
from confluent_kafka import Message

import pipeline.core.loop as loop_module
import pipeline.core.task as core_task_module
import pipeline.metrics as metrics_module
import pipeline.sinks.kafka.runner as runner_module
import pipeline.sinks.kafka.task as task_module
from pipeline import settings
from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.core.loop import IDLE_WAIT_S, PollLoop
from pipeline.examples.copier import app as copier
from pipeline.sinks.kafka.runner import KafkaRunner
from tests.fakes import FakeClock, FeedConsumer, NullProducer, kafka_message
from tests.harness import kafka_runner


def message(partition: int, offset: int, timestamp_ms: int = 0) -> Message:
    return kafka_message(offset, partition=partition, topic=copier.input_topic, timestamp_ms=timestamp_ms)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    fake_time = SimpleNamespace(
        monotonic=fake.monotonic, time=fake.time, perf_counter=fake.perf_counter, sleep=fake.sleep
    )
    for module in (loop_module, core_task_module, runner_module, task_module, metrics_module):
        monkeypatch.setattr(module, "time", fake_time)
    return fake


# -- the wait itself (PollLoop._poll) ---------------------------------------------------------------------------------
class Owned(Lifecycle):
    def __init__(self, partition: int) -> None:
        super().__init__()
        self.partition, self.next_offset = partition, None
        self._transition(Phase.RUNNING)


class Loop(PollLoop):
    def __init__(self, consumer: FeedConsumer, owned: dict[int, Owned], poll_max_records: int = 5_000) -> None:
        super().__init__(settings.Settings(poll_max_records=poll_max_records, commit_interval_ms=100))
        self.consumer = consumer
        self.owned = owned

    def _owned_partitions(self) -> dict[int, Owned]:
        return self.owned


def test_records_already_fetched_are_returned_without_waiting_for_a_full_batch(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock, [(clock.now, message(0, i)) for i in range(3)])
    started = clock.now
    batch = Loop(consumer, {})._poll(IDLE_WAIT_S)
    assert [m.offset() for m in batch] == [0, 1, 2]
    assert clock.now == started, "waited although records were there"
    assert consumer.waits[-1][1] == 0, "the rest of the batch must be taken without waiting"


def test_the_first_record_is_returned_when_it_arrives(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock, [(clock.now + 0.004, message(0, 0)), (clock.now + 0.050, message(0, 1))])
    started = clock.now
    batch = Loop(consumer, {})._poll(IDLE_WAIT_S)
    assert [m.offset() for m in batch] == [0]
    assert clock.now == pytest.approx(started + 0.004)


def test_the_wait_ends_when_the_earliest_transaction_is_due(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock)
    loop = Loop(consumer, {})
    loop.schedule.opened(clock.now - 0.08)  # COMMIT_INTERVAL_MS=100: due in 20 ms
    loop.schedule.opened(clock.now - 0.01)  # opened later: due later
    started = clock.now
    assert loop._poll(IDLE_WAIT_S) == []
    assert consumer.waits == [(started, pytest.approx(0.02, abs=1e-9))]


def test_a_transaction_already_due_is_not_waited_for(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock)
    loop = Loop(consumer, {})
    loop.schedule.opened(clock.now - 0.11)
    loop._poll(IDLE_WAIT_S)
    assert consumer.waits == [(clock.now, 0.0)]


def test_a_full_transaction_is_due_at_once(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock)
    loop = Loop(consumer, {})
    loop.schedule.opened(clock.now)
    loop.schedule.filled()  # COMMIT_MAX_RECORDS reached
    loop._poll(IDLE_WAIT_S)
    assert consumer.waits == [(clock.now, 0.0)]


def test_after_a_commit_round_nothing_bounds_the_wait_until_a_batch_opens(clock: FakeClock) -> None:
    # A partition dropped while its batch was open: the round that was due finds nothing to commit and starts over.
    dropped = Owned(0)
    dropped._transition(Phase.DROPPED)
    consumer = FeedConsumer(clock)
    loop = Loop(consumer, {0: dropped})
    loop.schedule.opened(clock.now - 0.2)
    assert loop._to_commit(clock.now) == []
    loop._poll(IDLE_WAIT_S)
    assert consumer.waits[0][1] == IDLE_WAIT_S


def test_a_batch_is_never_larger_than_poll_max_records(clock: FakeClock) -> None:
    consumer = FeedConsumer(clock, [(clock.now, message(0, i)) for i in range(10)])
    assert len(Loop(consumer, {}, poll_max_records=4)._poll(IDLE_WAIT_S)) == 4
    assert len(Loop(consumer, {}, poll_max_records=1)._poll(IDLE_WAIT_S)) == 1


# -- the Kafka runner end to end: commits exactly when due ------------------------------------------------------------
def running_runner(
    clock: FakeClock, consumer: FeedConsumer, interval_ms: int, guarantee: str
) -> tuple[KafkaRunner, NullProducer]:
    producer = NullProducer(clock)
    runner = kafka_runner(
        copier,
        consumer,
        lambda _: producer,
        app_id="poll-wait",
        commit_interval_ms=interval_ms,
        processing_guarantee=guarantee,
        producers="per_partition",  # a transaction per partition, each committed when due
    )
    for p in range(3):
        task = task_module.KafkaTask(runner.ctx, p, runner._transaction_for(p))
        task.start(0)
        runner.tasks[p] = task
    return runner, producer


@pytest.mark.parametrize("interval_ms", [20, 100, 1000])
def test_each_transaction_commits_when_due_not_when_a_batch_wait_ends(clock: FakeClock, interval_ms: int) -> None:
    # Sparse input: one record every 7 ms on partition 0 (far from a full batch), for about 3 commit intervals.
    start = clock.now
    times = [start + 0.007 * i for i in range(3 * interval_ms // 7)]
    consumer = FeedConsumer(clock, [(at, message(0, i, round(at * 1000))) for i, at in enumerate(times)])
    runner, producer = running_runner(clock, consumer, interval_ms, settings.EXACTLY_ONCE)
    while clock.now < start + 3.5 * interval_ms / 1000:
        runner._loop_once()
    assert len(producer.commits) >= 2
    opened = start  # a transaction opens with the first record after the previous commit
    for committed in producer.commits:
        assert committed == pytest.approx(opened + interval_ms / 1000, abs=1e-9), (
            f"committed {1000 * (committed - opened):.1f} ms after its transaction opened, not {interval_ms}"
        )
        opened = min((at for at in times if at >= committed), default=float("inf"))
    # The first record of each transaction waited exactly the commit interval for it.
    first = runner.metrics.end_to_end_latency.labels("first")
    assert first._sum.get() == pytest.approx(len(producer.commits) * interval_ms / 1000, abs=0.001)


def test_no_wait_ever_passes_the_next_due_commit(clock: FakeClock) -> None:
    # Records on every partition at random moments: whatever arrives, each wait ends by the earliest due commit.
    rng = random.Random(11)
    start = clock.now
    times = sorted((start + rng.uniform(0, 1.0), p) for p in range(3) for _ in range(60))
    offsets = dict.fromkeys(range(3), 0)
    arrivals = []
    for at, p in times:
        arrivals.append((at, message(p, offsets[p], round(at * 1000))))
        offsets[p] += 1
    consumer = FeedConsumer(clock, arrivals)
    runner, _ = running_runner(clock, consumer, 20, settings.AT_LEAST_ONCE)
    checked = 0
    while clock.now < start + 1.2:
        deadlines = [d for t in runner.tasks.values() if (d := t.commit_deadline()) is not None]
        waits_before = len(consumer.waits)
        runner._loop_once()
        for at, timeout in consumer.waits[waits_before:]:
            if deadlines:
                assert at + timeout <= min(deadlines) + 1e-9, "waited past a due commit"
                checked += 1
    assert checked > 10
    assert {offsets.partition for _, committed in consumer.committed_offsets for offsets in committed} == {0, 1, 2}


def test_real_clock_is_untouched_outside_the_fixture() -> None:
    assert loop_module.time is real_time


def test_when_one_transaction_is_due_every_open_one_commits_with_it(clock: FakeClock) -> None:
    # Transactions opened 0, 30 and 60 ms in: all three commit at 100 ms, in one pause of the loop, instead of
    # three pauses 30 ms apart; none is ever later than its own deadline.
    start = clock.now
    consumer = FeedConsumer(
        clock, [(start + 0.03 * p, message(p, 0, round((start + 0.03 * p) * 1000))) for p in range(3)]
    )
    runner, producer = running_runner(clock, consumer, 100, settings.EXACTLY_ONCE)
    while clock.now < start + 0.15:
        runner._loop_once()
    assert producer.commits == [pytest.approx(start + 0.1, abs=1e-9)] * 3
    assert runner.metrics.transactions.labels("2", "committed")._value.get() == 1
