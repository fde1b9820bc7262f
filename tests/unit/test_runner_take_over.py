"""The Kafka runner's take-over leaves no partition paused that should be fetched (no broker: the recording consumer
of tests/fakes.py)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from pipeline.app import App
from pipeline.core.lifecycle import Phase
from pipeline.examples.copier import app as copier
from pipeline.examples.running_totals import app as totals
from pipeline.sinks.kafka.runner import KafkaRunner
from tests.fakes import FakeConsumer, NullProducer
from tests.harness import kafka_runner


def runner_for(app: App, consumer: FakeConsumer) -> KafkaRunner:
    runner = kafka_runner(app, consumer, lambda _: NullProducer(), app_id="take-over")
    runner.restores.start = lambda p, committed_offset, copy=None: None  # the restore itself is not under test
    return runner


def test_a_partition_paused_by_a_drop_is_fetched_again_after_its_next_assignment() -> None:
    consumer = FakeConsumer(committed_offset=10)
    consumer.paused = {0, 1}  # dropped (fenced) earlier, then lost: librdkafka still has them paused
    runner = runner_for(copier, consumer)
    runner._on_assign(consumer, [TopicPartition(copier.input_topic, 0), TopicPartition(copier.input_topic, 1)])
    assert all(t.phase is Phase.RUNNING for t in runner.tasks.values())
    assert consumer.paused == set()


def test_a_stateful_partition_stays_paused_until_restored_and_a_re_take_over_resumes_a_stateless_one() -> None:
    consumer = FakeConsumer(committed_offset=10)
    runner = runner_for(totals, consumer)
    runner._on_assign(consumer, [TopicPartition(totals.input_topic, 0)])
    assert runner.tasks[0].phase is Phase.RESTORING and consumer.paused == {0}

    consumer = FakeConsumer(committed_offset=10)
    runner = runner_for(copier, consumer)
    consumer.paused = {2}  # still assigned, paused by the drop
    runner._take_over([2], reassign=True)
    assert consumer.paused == set()


def test_a_finished_restore_puts_the_position_at_the_committed_offset_before_resuming() -> None:
    """Whatever was fetched (and dropped) while p restored must be fetched again: resuming from the fetched position
    would skip it. (docs/guarantees.md: rewind-after-abort)"""
    consumer = FakeConsumer(committed_offset=10)
    runner = runner_for(totals, consumer)
    runner._on_assign(consumer, [TopicPartition(totals.input_topic, 0)])
    consumer.calls.clear()

    class Finished:
        partition, state, snapshot, end = 0, runner.tasks[0].state, None, 0
        seconds, records, snapshot_entries, tables = 0.1, 0, 0, None

        def summary(self) -> str:
            return "p0 restored"

    runner._restored(runner.tasks[0], Finished())
    assert consumer.moves() == [("seek", 0, 10), ("resume", 0, None)]
    assert runner.tasks[0].phase is Phase.RUNNING
