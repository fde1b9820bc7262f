"""Restore is complete and consistent, refuses loudly when something is missing, and never costs the group membership
(docs/guarantees.md: complete-restore, restore-keeps-membership)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline import settings
from pipeline.examples.running_totals import app as totals
from pipeline.kafka.offsets import TailReader
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.state.restore import RestoreError
from pipeline.testing import checker, inputs
from pipeline.testing.harness import wait_caught_up
from tests.support import eventually


def fresh_app(bootstrap: str, partitions: int = 1):
    suffix = uuid.uuid4().hex[:8]
    app = totals.with_topics(f"in-{suffix}", f"out-{suffix}")
    inputs.create_topics(bootstrap, {app.input_topic: partitions, app.output_topic: partitions})
    return app, f"restore-{suffix}"


def make_runner(app, app_id: str, bootstrap: str, **overrides) -> KafkaRunner:
    return KafkaRunner(app, settings.load(env={}, bootstrap_servers=bootstrap, app_id=app_id, **overrides))


@contextmanager
def running(runner: KafkaRunner) -> Iterator[KafkaRunner]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            runner.run()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield runner
    except BaseException as failure:
        runner.stop()
        thread.join(60)
        if errors:
            raise failure from errors[0]  # what the runner died of is the real story
        raise
    runner.stop()
    thread.join(60)
    if errors:
        raise errors[0]


def process_all(app, app_id: str, bootstrap: str, partitions: int = 1) -> None:
    with running(make_runner(app, app_id, bootstrap)):
        assert not wait_caught_up(bootstrap, app_id, app.input_topic, partitions, 60)


def test_restart_restores_state_and_continues_exactly_once(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 2_000, partitions=1, seed=1)
    process_all(app, app_id, kafka_bootstrap)

    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 2_000, partitions=1, seed=2)
    runner = make_runner(app, app_id, kafka_bootstrap)
    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 60)
    restored = runner.metrics.restore_records.labels("0")._value.get()
    assert restored > 50  # the first run's changes and checkpoints were read back
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()


def test_checkpoint_that_disagrees_with_the_group_offset_refuses_to_start(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1)
    process_all(app, app_id, kafka_bootstrap)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_consumer_groups([app_id], request_timeout=10)[app_id].result(10)  # e.g. expired group offsets

    refusal = r"checkpoint covers input offset 500 but the group's committed offset is None"
    with pytest.raises(RestoreError, match=refusal):
        make_runner(app, app_id, kafka_bootstrap).run()


def test_truncated_changelog_without_snapshot_refuses_to_start(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1)
    process_all(app, app_id, kafka_bootstrap)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    changelog = TopicPartition(f"{app_id}-changelog", 0, 10)
    admin.delete_records([changelog], request_timeout=10)[changelog].result(10)

    with pytest.raises(RestoreError, match=r"starts at offset 10, not 0"):
        make_runner(app, app_id, kafka_bootstrap).run()


def fill_changelog(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer(inputs.producer_config(bootstrap))
    for i in range(records):
        producer.produce(topic, b"[1,%d]" % i, b"key-%d" % (i % 5_000), partition=0)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


@pytest.fixture
def slow_restore(monkeypatch):
    """Every changelog read step takes 50 ms longer, so restoring ~200 steps takes ~10 s > max.poll.interval.ms."""
    original = TailReader.step

    def slow_step(self, timeout_s=0.1, max_records=10_000):
        time.sleep(0.05)
        return original(self, timeout_s, max_records=500)

    monkeypatch.setattr(TailReader, "step", slow_step)


def restore_a_long_changelog(bootstrap: str, runner_class: type[KafkaRunner], until) -> KafkaRunner:
    app, app_id = fresh_app(bootstrap)
    runner = runner_class(
        app,
        settings.load(
            env={},
            bootstrap_servers=bootstrap,
            app_id=app_id,
            max_poll_interval_ms=6_000,
            session_timeout_ms=6_000,
            request_timeout_ms=2_000,
            restore_step_ms=100,
        ),
    )
    runner.open()  # creates the changelog
    fill_changelog(bootstrap, runner.changelog_topic, 100_000)
    with running(runner):
        eventually(lambda: until(runner), timeout_s=90, interval_s=0.2)
    return runner


def test_long_restore_keeps_the_group_membership(kafka_bootstrap, slow_restore):
    restore_seconds = []

    def restored(r: KafkaRunner) -> bool:
        if r.tasks and r.is_ready():
            restore_seconds.append(r.metrics.restore_seconds.labels("0")._value.get())
        return bool(restore_seconds)

    runner = restore_a_long_changelog(kafka_bootstrap, KafkaRunner, restored)
    assert restore_seconds[0] > 6  # longer than max.poll.interval.ms
    assert runner.metrics.lost._value.get() == 0


class BlockingRestoreRunner(KafkaRunner):
    """Test double breaking restore-keeps-membership: restores each partition to the end in one go on the poll
    thread."""

    def _advance_restores(self) -> None:
        for restore in self.restores.running().values():
            while not restore.step(1.0):
                pass
        super()._advance_restores()


def test_blocking_restore_loses_the_membership(kafka_bootstrap, slow_restore):
    runner = restore_a_long_changelog(kafka_bootstrap, BlockingRestoreRunner, lambda r: r.metrics.lost._value.get())
    assert runner.metrics.lost._value.get() >= 1


def test_snapshot_on_shutdown_makes_the_next_restore_read_no_changelog(kafka_bootstrap, caplog):
    app, app_id = fresh_app(kafka_bootstrap, partitions=2)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 3_000, partitions=2, seed=5)
    with (
        caplog.at_level("INFO", logger="pipeline.sinks.kafka"),
        running(make_runner(app, app_id, kafka_bootstrap, snapshot_on_shutdown=True)),
    ):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 2, 60)
    assert caplog.text.count("published on shutdown") == 2, caplog.text

    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 1_000, partitions=2, seed=6)
    runner = make_runner(app, app_id, kafka_bootstrap)
    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 2, 60)
    for p in ("0", "1"):
        assert runner.metrics.restore_snapshot_entries.labels(p)._value.get() > 0
        assert runner.metrics.restore_records.labels(p)._value.get() == 0  # the snapshot covers the whole changelog
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()  # the state the outputs continued from was the committed one


def test_input_records_deleted_before_processing_stop_the_partition_naming_the_fix(kafka_bootstrap, caplog):
    """Retention (or delete_records) removed input records the group had not processed: p stops with an ERROR that
    says what was lost and how to go on; nothing after the gap is processed. With auto.offset.reset=earliest the
    consumer jumped over them silently (a broker-restart fault run lost 200 records so)."""
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 100, partitions=1, seed=1)
    process_all(app, app_id, kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 100, partitions=1, seed=2)
    tp = TopicPartition(app.input_topic, 0, 150)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept: a collected client never answers
    admin.delete_records([tp], request_timeout=10)[tp].result(10)
    runner = make_runner(app, app_id, kafka_bootstrap)
    with running(runner):
        # p0 stopped, the only partition: the runner ends by itself (docs/guarantees.md: fail-fast)
        eventually(lambda: runner.metrics.registry.get_sample_value("pipeline_stopped_partitions") == 1, 30)
    assert "the records from offset 100 on were deleted before they were processed" in caplog.text
    assert "--reset-offsets --to-earliest" in caplog.text
    lag = wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 1)
    assert lag == {0: 100}, "the committed offset moved past the gap"


def test_a_producer_fenced_before_the_shutdown_snapshot_stops_cleanly_without_it(kafka_bootstrap, caplog):
    """A fault run: the heartbeat thread of another process fenced this one's producer while it looked silent; on its
    clean stop the shutdown snapshot's flush then failed with a SystemError (confluent_kafka loses the fatal error's
    exception), and the instance exited with code 1 instead of stopping."""
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1, seed=7)
    with (
        caplog.at_level("INFO", logger="pipeline.sinks.kafka"),
        running(make_runner(app, app_id, kafka_bootstrap, snapshot_on_shutdown=True, producers="per_partition")),
    ):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 60)
        newer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{app_id}.{app.input_topic}.0"})
        newer.init_transactions(30)  # fences the running instance's producer
    assert "published on shutdown" not in caplog.text
    assert "snapshot on shutdown not published" in caplog.text, caplog.text
