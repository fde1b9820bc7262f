"""The Kafka client configurations every runner shares: where read_committed and no auto-commit are set, once
(docs/guarantees.md: read-committed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from pipeline.kafka.logs import librdkafka_log
from pipeline.settings import CLASSIC, Settings


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | None, **kwargs: Any) -> None:
    """produce(), waiting while the producer's local queue is full (BufferError) for deliveries to drain it."""
    while True:
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def client_config(settings: Settings) -> dict[str, Any]:
    """Every client's: the brokers and the PIPELINE_KAFKA_* properties (admin clients use it as it is)."""
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}


def polled_client_config(settings: Settings) -> dict[str, Any]:
    """A client that is polled: its librdkafka log lines go through Python logging, rate-limited
    (pipeline/kafka/logs.py)."""
    return {**client_config(settings), "logger": librdkafka_log(settings.kafka_log_interval_ms)}


def consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """The input consumer: read_committed, offsets committed only by the protocol, incremental rebalancing."""
    s = settings
    config = {
        # Fetch sizing, defaults that the [kafka] settings may override (issue 23; BENCHMARKS.md, "Backlog drain").
        # librdkafka waits fetch.queue.backoff.ms (1 s) before it fetches a partition again whose queue is over
        # queued.min.messages: a loop draining a backlog of few partitions emptied the queue first and waited for
        # records ~45 % of the time (3 partitions: 120k -> 200k records/s at 10 ms). fetch.max.bytes (50 MB) bounds
        # one fetch response, all partitions together: at 384 partitions every fetch was that large, held in memory
        # until its last record was consumed (peak RSS 2.2x that of 3 partitions; 1.2x at 8 MB, and faster).
        "fetch.queue.backoff.ms": 10,
        "fetch.max.bytes": 8 * 1024 * 1024,
        # queued.min.messages (100,000 per partition) lets the first partitions fetched fill the whole prefetch
        # budget (queued.max.messages.kbytes): draining a backlog of 384 partitions of small record batches, the
        # others were not fetched for 32 s and the stall watchdog warned for 3-55 of them a run. At 2,000 the budget is
        # spread over the partitions: no warning, peak RSS 30 % lower at 3 and at 384 partitions, the same rate at 3
        # (BENCHMARKS.md, "Partition scale: CPU by thread").
        "queued.min.messages": 2_000,
        **polled_client_config(s),
        "group.id": group_id,
        "group.protocol": s.group_protocol,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # A position below the log start (input records deleted by retention or delete_records before they were
        # processed) is an error that stops the partition, never a silent jump to the earliest offset: seen in a
        # broker-restart fault run, where a restarted node deleted old-timestamped input records and the tasks
        # skipped 200 of them. Nothing committed yet: the runners ask for OFFSET_BEGINNING themselves.
        "auto.offset.reset": "error",
        "max.poll.interval.ms": s.max_poll_interval_ms,
        # The broker answers a fetch as soon as fetch.min.bytes are there (1: librdkafka's default, set here because
        # a larger value trades latency for fewer requests). fetch.wait.max.ms only bounds an empty fetch: how soon a
        # partition just resumed or sought back (end of a restore, a rewind, a take-over) joins the next fetch.
        "fetch.min.bytes": 1,
        "fetch.wait.max.ms": 50,
    }
    if s.group_protocol == CLASSIC:  # the clients heartbeat and assign (cooperative: only moved partitions stop)
        config |= {
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms(s),
        }
    # GROUP_PROTOCOL=consumer (KIP-848): the broker assigns, always incrementally (group.remote.assignor, by default
    # the broker's first of group.consumer.assignors); session timeout and heartbeat interval are the group's (broker
    # group.consumer.session.timeout.ms / group.consumer.heartbeat.interval.ms, or the group configs
    # consumer.session.timeout.ms / consumer.heartbeat.interval.ms): librdkafka refuses the three on the client.
    if s.group_instance_id:
        config["group.instance.id"] = s.group_instance_id
    return config


def heartbeat_interval_ms(s: Settings) -> int:
    """HEARTBEAT_INTERVAL_MS, at most a quarter of FAILURE_DETECTION_MS when that is on: a member the detector
    removes starts a rebalance that the others hear of only at their next heartbeat (a 1 s interval cost take-overs
    0.5 s on average, measured in the fail-over benchmark)."""
    if s.failure_detection_ms > 0:
        return min(s.heartbeat_interval_ms, max(100, s.failure_detection_ms // 4))
    return s.heartbeat_interval_ms


def producer_config(
    settings: Settings, transactional_id: str | None, on_delivery: Callable[[Any, Any], None] | None = None
) -> dict[str, Any]:
    """Idempotent; transactional when given a transactional.id; `on_delivery` gets every message's delivery report
    that has no callback of its own (the runner's producers: sinks/kafka/transaction.py, Deliveries)."""
    config = {
        # Tuning defaults that the [kafka] settings may override (PIPELINE_KAFKA_LINGER_MS, say); the guarantees'
        # properties below may not.
        # exactly_once: outputs become visible at the commit, which sends whatever lingers at once (commit 1-1.5 ms
        # with 5 or 0), so lingering costs no latency and makes fewer, larger requests. at_least_once: an output is
        # visible once sent, so linger.ms adds up to 5 ms; 1 ms was tried and measured worse on 2 shared cores (3-5x
        # the produce requests: p50 1.0-1.6 s vs 0.65-1.3 s at 61k rec/s, p99 +100 ms at 12k rec/s; BENCHMARKS.md).
        "linger.ms": 5,
        # Back-to-back transactions hit CONCURRENT_TRANSACTIONS while markers are written: retry soon.
        "retry.backoff.ms": 10,
        "retry.backoff.max.ms": 100,
        **polled_client_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",  # the Java client's partitioner: same key, same partition
    }
    if transactional_id is not None:
        config |= {"transactional.id": transactional_id, "transaction.timeout.ms": settings.transaction_timeout_ms}
    if on_delivery is not None:
        config["on_delivery"] = on_delivery
    return config


def restore_consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """Reads internal topics by assignment; never commits, never jumps over deleted records."""
    return {
        **polled_client_config(settings),
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",  # records deleted under a restore: an error, never a silent jump
        "fetch.wait.max.ms": 10,  # a fetch left waiting at one partition's end delays the next assign's first fetch
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
    }
