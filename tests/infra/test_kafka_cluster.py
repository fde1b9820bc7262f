"""The 3-node KRaft cluster keeps accepting idempotent writes with one node down, and loses none of them."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.offsets import TailReader, high_watermarks, read_to_end

pytestmark = pytest.mark.cluster


def produce_acked(producer: Producer, topic: str, values: list[bytes]) -> list[bytes]:
    acked: list[bytes] = []

    def on_delivery(err, msg):
        if err is None:
            acked.append(msg.value())

    for value in values:
        producer.produce(topic, value, on_delivery=on_delivery)
    assert producer.flush(60) == 0, "records still unacknowledged after 60 s"
    return acked


def test_writes_survive_killing_one_node(kafka_cluster):
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    acked = produce_acked(producer, topic, [b"before-%d" % i for i in range(300)])

    kafka_cluster.kill(2)
    try:
        acked += produce_acked(producer, topic, [b"during-%d" % i for i in range(300)])
    finally:
        kafka_cluster.restart(2)
    acked += produce_acked(producer, topic, [b"after-%d" % i for i in range(300)])

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "group.id": "check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    ends = high_watermarks(admin, topic, [0, 1, 2], 30)
    seen = [m.value() for m in read_to_end(TailReader(consumer, topic, dict.fromkeys(ends, 0), ends), 60)]
    consumer.close()

    assert len(acked) == 900
    assert sorted(seen) == sorted(acked)
