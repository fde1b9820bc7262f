"""Proofs that the broker under the tests implements transactions for real (each fails against a fake)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.kafka.offsets import TailReader, high_watermarks, read_to_end
from tests.support import eventually


def transactional_producer(bootstrap: str, txn_id: str | None = None) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id or uuid.uuid4().hex})
    producer.init_transactions(30)
    return producer


def drain(bootstrap: str, admin: AdminClient, topic: str, isolation: str, partitions: int = 1) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "drain", "isolation.level": isolation, "enable.auto.commit": False}
    )
    try:
        ends = high_watermarks(admin, topic, list(range(partitions)), 10)
        reader = TailReader(consumer, topic, dict.fromkeys(ends, 0), ends)
        return [m.value() for m in read_to_end(reader, 20)]
    finally:
        consumer.close()


def list_offset(admin: AdminClient, topic: str, isolation: IsolationLevel) -> int:
    tp = TopicPartition(topic, 0)
    return admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation)[tp].result().offset


def test_aborted_records_are_invisible_to_read_committed_only(kafka_bootstrap, kafka_admin, new_topic):
    topic = new_topic()
    producer = transactional_producer(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush()
    producer.abort_transaction(30)

    assert drain(kafka_bootstrap, kafka_admin, topic, "read_committed") == [b"committed"]
    assert drain(kafka_bootstrap, kafka_admin, topic, "read_uncommitted") == [b"committed", b"aborted"]


def test_open_transaction_holds_last_stable_offset_below_high_watermark(kafka_bootstrap, kafka_admin, new_topic):
    topic = new_topic()
    producer = transactional_producer(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b"pending")
    producer.flush()

    high_watermark = list_offset(kafka_admin, topic, IsolationLevel.READ_UNCOMMITTED)
    last_stable = list_offset(kafka_admin, topic, IsolationLevel.READ_COMMITTED)
    assert (last_stable, high_watermark) == (0, 1)

    producer.commit_transaction(30)
    # The commit marker (offset 1) is written just after commit_transaction returns.
    eventually(lambda: list_offset(kafka_admin, topic, IsolationLevel.READ_COMMITTED) == 2)


def test_second_producer_with_same_transactional_id_fences_the_first(kafka_bootstrap, kafka_admin, new_topic):
    topic = new_topic()
    txn_id = f"fence-{uuid.uuid4().hex}"
    zombie = transactional_producer(kafka_bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie")
    zombie.flush()

    successor = transactional_producer(kafka_bootstrap, txn_id)  # aborts the zombie's open transaction
    successor.begin_transaction()
    successor.produce(topic, b"successor")
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as failure:
        zombie.produce(topic, b"late")
        zombie.commit_transaction(30)
    error = failure.value.args[0]
    assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
    assert drain(kafka_bootstrap, kafka_admin, topic, "read_committed") == [b"successor"]


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_send_offsets_to_transaction_commits_offsets_with_outputs(kafka_bootstrap, kafka_admin, new_topic):
    source, sink = new_topic("in"), new_topic("out")
    group = f"group-{uuid.uuid4().hex}"
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(source, 0, 0)])
    producer = transactional_producer(kafka_bootstrap)

    def transaction(next_offset: int, value: bytes, commit: bool) -> None:
        producer.begin_transaction()
        producer.produce(sink, value)
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, next_offset)], consumer.consumer_group_metadata(), 30
        )
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    transaction(5, b"first", commit=True)
    transaction(9, b"second", commit=False)

    assert committed_offset(kafka_bootstrap, group, source) == 5
    assert drain(kafka_bootstrap, kafka_admin, sink, "read_committed") == [b"first"]
    consumer.close()
