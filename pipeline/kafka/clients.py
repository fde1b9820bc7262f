"""The Kafka client configurations every runner shares: where read_committed and no auto-commit are set, once
(docs/guarantees.md: read-committed)."""

from __future__ import annotations

from confluent_kafka import Producer

from pipeline.settings import Settings


def produce_waiting(producer: Producer, topic: str, value, key, **kwargs) -> None:
    """produce(), waiting while the producer's local queue is full (BufferError) for deliveries to drain it."""
    while True:
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def client_config(settings: Settings) -> dict:
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}


def consumer_config(settings: Settings, group_id: str) -> dict:
    """The input consumer: read_committed, offsets committed only by the protocol, cooperative rebalancing."""
    s = settings
    config = {
        **client_config(s),
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": s.session_timeout_ms,
        "heartbeat.interval.ms": s.heartbeat_interval_ms,
        "max.poll.interval.ms": s.max_poll_interval_ms,
        "fetch.wait.max.ms": 50,
    }
    if s.group_instance_id:
        config["group.instance.id"] = s.group_instance_id
    return config


def producer_config(settings: Settings, transactional_id: str | None) -> dict:
    """Idempotent; transactional when given a transactional.id."""
    config = {
        **client_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "partitioner": "murmur2_random",  # the Java client's partitioner: same key, same partition
        # Back-to-back transactions hit CONCURRENT_TRANSACTIONS while markers are written: retry soon.
        "retry.backoff.ms": 10,
        "retry.backoff.max.ms": 100,
    }
    if transactional_id is not None:
        config |= {"transactional.id": transactional_id, "transaction.timeout.ms": settings.transaction_timeout_ms}
    return config


def restore_consumer_config(settings: Settings, group_id: str) -> dict:
    """Reads internal topics by assignment; never commits, never jumps over deleted records."""
    return {
        **client_config(settings),
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # records deleted under a restore: an error, never a silent jump
        "fetch.wait.max.ms": 10,  # a fetch left waiting at one partition's end delays the next assign's first fetch
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
    }
