"""The Kafka runner's take-over leaves no partition paused that should be fetched (no broker: a recording consumer)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from pipeline import settings
from pipeline.core.lifecycle import Phase
from pipeline.examples.copier import app as copier
from pipeline.examples.running_totals import app as totals
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTaskContext


class RecordingConsumer:
    """Keeps librdkafka's rule that matters here: a pause survives unassign/assign until resume()."""

    def __init__(self) -> None:
        self.paused: set[int] = set()

    def committed(self, tps, timeout=None):
        return [TopicPartition(tp.topic, tp.partition, 10) for tp in tps]

    def incremental_assign(self, tps) -> None:
        pass

    def seek(self, tp) -> None:
        pass

    def pause(self, tps) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps) -> None:
        self.paused -= {tp.partition for tp in tps}

    def consumer_group_metadata(self):
        return object()


class NullProducer:
    def init_transactions(self, timeout=None) -> None:
        pass


def runner_for(app, consumer: RecordingConsumer) -> KafkaRunner:
    runner = KafkaRunner(app, settings.load(env={}, bootstrap_servers="unused:9092", app_id="take-over"))
    runner.consumer = consumer
    runner._make_producer = lambda _: NullProducer()  # type: ignore[method-assign,assignment,return-value]
    runner.ctx = KafkaTaskContext(
        app,
        runner.settings,
        runner.app_id,
        app.input_topic,
        app.output_topic,
        "cl",
        "dlq",
        consumer,  # type: ignore[arg-type]
        runner.metrics,
    )
    runner.restores.start = lambda p, committed_offset: None  # the restore itself is not under test
    return runner


def test_a_partition_paused_by_a_drop_is_fetched_again_after_its_next_assignment() -> None:
    consumer = RecordingConsumer()
    consumer.paused = {0, 1}  # dropped (fenced) earlier, then lost: librdkafka still has them paused
    runner = runner_for(copier, consumer)
    runner._on_assign(consumer, [TopicPartition(copier.input_topic, 0), TopicPartition(copier.input_topic, 1)])
    assert all(t.phase is Phase.RUNNING for t in runner.tasks.values())
    assert consumer.paused == set()


def test_a_stateful_partition_stays_paused_until_restored_and_a_re_take_over_resumes_a_stateless_one() -> None:
    consumer = RecordingConsumer()
    runner = runner_for(totals, consumer)
    runner._on_assign(consumer, [TopicPartition(totals.input_topic, 0)])
    assert runner.tasks[0].phase is Phase.RESTORING and consumer.paused == {0}

    consumer = RecordingConsumer()
    runner = runner_for(copier, consumer)
    consumer.paused = {2}  # still assigned, paused by the drop
    runner._take_over([2], reassign=True)
    assert consumer.paused == set()


class SeekRecordingConsumer(RecordingConsumer):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int | None]] = []

    def seek(self, tp) -> None:
        self.calls.append(("seek", tp.partition, tp.offset))

    def resume(self, tps) -> None:
        super().resume(tps)
        self.calls += [("resume", tp.partition, None) for tp in tps]


def test_a_finished_restore_puts_the_position_at_the_committed_offset_before_resuming() -> None:
    """Whatever was fetched (and dropped) while p restored must be fetched again: resuming from the fetched position
    would skip it. (docs/guarantees.md: rewind-after-abort)"""
    consumer = SeekRecordingConsumer()
    runner = runner_for(totals, consumer)
    runner._on_assign(consumer, [TopicPartition(totals.input_topic, 0)])
    consumer.calls.clear()

    class Finished:
        partition, state, snapshot, end = 0, runner.tasks[0].state, None, 0
        seconds, records, snapshot_entries = 0.1, 0, 0

        def summary(self) -> str:
            return "p0 restored"

    runner._restored(Finished())
    assert consumer.calls == [("seek", 0, 10), ("resume", 0, None)]
    assert runner.tasks[0].phase is Phase.RUNNING
