"""The quick fence (pipeline/kafka/kafka_python.py) against a real broker: it aborts what the last producer of a
transactional id left open, so that the old producer can never commit it; and it is only ever a help: with nothing
to reach it gives up without raising, and librdkafka's fence after it still works."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline import settings
from pipeline.kafka.kafka_python import quick_fence
from pipeline.testing import inputs


def _open_transaction(bootstrap: str, txn_id: str, topic: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, b"left open")
    producer.flush(10)
    return producer


def test_the_quick_fence_aborts_what_the_last_producer_left_open_and_the_real_fence_follows(kafka_bootstrap):
    topic, txn_id = f"fence-{uuid.uuid4().hex[:8]}", f"quick-{uuid.uuid4().hex[:8]}"
    inputs.create_topics(kafka_bootstrap, {topic: 1})
    zombie = _open_transaction(kafka_bootstrap, txn_id, topic)
    quick_fence(settings.load(env={}, bootstrap_servers=kafka_bootstrap), txn_id)
    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)  # fenced: what it left open is aborted, never committed
    successor = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": txn_id})
    successor.init_transactions(10)  # librdkafka's own fence comes after it, as in Transaction.fence
    successor.begin_transaction()
    successor.produce(topic, b"committed")
    successor.commit_transaction(10)
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": txn_id, "isolation.level": "read_committed"})
    reader.assign([TopicPartition(topic, 0, 0)])
    seen = [m.value() for m in reader.consume(10, 5) if m.error() is None]
    reader.close()
    assert seen == [b"committed"]


def test_with_no_broker_to_reach_the_quick_fence_gives_up_quietly():
    quick_fence(settings.load(env={}, bootstrap_servers="127.0.0.1:1", request_timeout_ms=1000), "nobody")
