"""A transaction commits only once every one of its messages was acknowledged by the broker with an offset
(pipeline/sinks/kafka/transaction.py: Deliveries). librdkafka also reports a message delivered, without an offset, when
a later message of its partition was acknowledged while its own outcome was unknown ("implicitly acked"): after a
partition leader died, the new leader may have taken the later message as the producer's first and never have the
earlier one. The 3-node cluster fault run committed such a transaction: two dead letters missing, the dead-letter
partition beginning at sequence 2 of the producer's epoch. Against the recording fakes of tests/fakes.py."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import TopicPartition

from pipeline.core.lifecycle import Phase
from pipeline.examples.copier import app as copier
from pipeline.kafka.clients import producer_config
from pipeline.settings import Settings
from pipeline.sinks.kafka.commit import SlowCommit
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.transaction import Deliveries, PartitionDropped, TransactionAborted
from tests.fakes import FENCED, Calls, FakeConsumer, FakeProducer, kafka_exception, kafka_message
from tests.harness import Harness, kafka_runner, msg


def runner_on(calls: Calls, consumer: FakeConsumer, no_offset_for: tuple[str, ...]) -> KafkaRunner:
    """A per_partition runner whose producers report deliveries to the runner's callback, as librdkafka does; the
    messages of `no_offset_for` come back without an offset."""
    runner = kafka_runner(copier, consumer, lambda _: None, app_id="unit")

    def make(txn_id: str | None, on_delivery=None) -> FakeProducer:  # type: ignore[no-untyped-def]
        return FakeProducer(calls, txn_id, on_delivery=on_delivery, no_offset_for=no_offset_for)

    runner._make_producer = make  # type: ignore[method-assign,assignment]
    return runner


def processed_then_committed(no_offset_for: tuple[str, ...]) -> tuple[Calls, FakeConsumer, KafkaRunner]:
    calls, consumer = Calls(), FakeConsumer(committed_offset=10)
    runner = runner_on(calls, consumer, no_offset_for)
    runner._on_assign(consumer, [TopicPartition(copier.input_topic, 0)])
    runner._dispatch([kafka_message(10, topic=copier.input_topic), kafka_message(11, topic=copier.input_topic)])
    calls.clear()
    consumer.seeks.clear()
    runner._commit(runner.tasks[0].txn)  # as when the transaction is due
    return calls, consumer, runner


def test_a_transaction_whose_output_was_acknowledged_without_an_offset_is_aborted_and_taken_again() -> None:
    calls, consumer, runner = processed_then_committed(no_offset_for=(copier.output_topic,))
    assert "commit_transaction" not in calls.names() and "abort_transaction" in calls.names()
    task = runner.tasks[0]
    assert consumer.seeks == [(0, 10)] and task.next_offset == 10 and task.phase is Phase.RUNNING


def test_a_transaction_whose_messages_were_all_acknowledged_commits() -> None:
    calls, consumer, runner = processed_then_committed(no_offset_for=())
    assert calls.names()[-3:] == ["send_offsets_to_transaction", "flush", "commit_transaction"]
    assert runner.tasks[0].committed_offset == 12 and not consumer.seeks


def test_reports_of_an_aborted_transaction_do_not_count_for_the_next() -> None:
    deliveries = Deliveries()
    deliveries.report("_PURGE_QUEUE", kafka_message(-1001))
    assert deliveries.unconfirmed == 1 and deliveries.first is not None and "_PURGE_QUEUE" in deliveries.first
    deliveries.report(None, kafka_message(5))
    assert deliveries.unconfirmed == 1
    deliveries.clear()
    assert deliveries.unconfirmed == 0 and deliveries.first is None


def test_the_runners_producers_report_every_delivery() -> None:
    report = Deliveries().report
    assert producer_config(Settings(), "unit.in.0", report)["on_delivery"] is report


def test_a_slow_commit_is_logged_with_the_time_of_each_step(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "pipeline.sinks.kafka.commit"):
        with SlowCommit("p0", limit_s=10) as fast:
            fast.done("commit_transaction")
        assert not caplog.records
        with pytest.raises(TransactionAborted), SlowCommit("p0", limit_s=0) as slow:
            slow.done("send_offsets_to_transaction")
            raise TransactionAborted("unit")
    (record,) = caplog.records
    assert "p0: commit took" in record.message and "(send_offsets_to_transaction 0.0 s; then TransactionAborted)" in (
        record.message
    )


def test_a_fenced_error_that_surfaced_inside_a_delivery_callback_drops_the_partition() -> None:
    """confluent_kafka raises a SystemError around librdkafka's error when it surfaces while a Python delivery
    callback runs (a cluster fault run: "Deliveries.report returned a result with an exception set", caused by the
    fenced producer's error). Classified by its cause: a fenced producer drops p, it does not end the process."""
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    wrapped = SystemError("<function Deliveries.report> returned a result with an exception set")
    wrapped.__cause__ = kafka_exception(**FENCED)
    h.producers[0].fail("flush", wrapped)
    with pytest.raises(PartitionDropped, match="flush"):
        h.commit(task)
    assert task.txn.broken and "commit_transaction" not in h.calls.names()


def test_a_producer_error_lost_inside_a_delivery_callback_drops_the_partition() -> None:
    """confluent_kafka can lose the error altogether: a flush raised "returned NULL without setting an exception" with
    no cause, right after librdkafka logged the producer fenced (a CI broker fault run, where the instance exited
    with code 1). The producer's state is unknown: p is dropped, nothing commits, the process goes on."""
    h = Harness()
    task = h.task(committed=0)
    task.process([msg(0)])
    h.producers[0].fail("flush", SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL"))
    with pytest.raises(PartitionDropped, match="flush: the producer failed and its error was lost"):
        h.commit(task)
    assert task.txn.broken and "commit_transaction" not in h.calls.names()
