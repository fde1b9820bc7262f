"""The same work as an example App, written by hand with confluent-kafka: no framework, no transactions, no state
store, no provenance header. What a user would write to skip the template, and the yardstick of its per-record cost
(issue 33: ours / same work by hand).

Each workload is one function over a consumed batch that decodes, updates a plain dict, encodes and produces, with
the App's serdes and record shapes (running_totals: key UTF-8 text, value orjson {"id", "amount"} in, orjson
{"id", "count", "sum"} out, the output partitioned by key; copier: bytes through, to the input's partition number).
Used by the `hand` mode of `python -m tools.bench` (with a consumer and offset commits every commit interval) and by
`python -m tools.bench --overhead` (over in-memory messages, beside the App's task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from confluent_kafka import KafkaException, Producer

from pipeline.kafka.clients import produce_waiting

# (batch of consumed messages, producer, output topic) -> None
HandBatch = Callable[[Sequence[Any], Producer, str], None]


def copier() -> HandBatch:
    def copy_batch(batch: Sequence[Any], producer: Producer, topic: str) -> None:
        produce = producer.produce
        for m in batch:
            if m.error():
                raise KafkaException(m.error())
            try:
                produce(topic, m.value(), m.key(), partition=m.partition())
            except BufferError:
                produce_waiting(producer, topic, m.value(), m.key(), partition=m.partition())
        producer.poll(0)

    return copy_batch


def running_totals() -> HandBatch:
    totals: dict[str, tuple[int, int]] = {}  # account -> (count, sum)

    def totals_batch(batch: Sequence[Any], producer: Producer, topic: str) -> None:
        produce, loads, dumps = producer.produce, orjson.loads, orjson.dumps
        for m in batch:
            if m.error():
                raise KafkaException(m.error())
            key = m.key().decode()
            value = loads(m.value())
            amount = value["amount"]
            if not isinstance(amount, int):
                raise TypeError(f"amount must be an integer, got {amount!r}")
            count, total = totals.get(key, (0, 0))
            count, total = count + 1, total + amount
            totals[key] = (count, total)
            out = dumps({"id": value["id"], "count": count, "sum": total})
            try:
                produce(topic, out, key.encode())
            except BufferError:
                produce_waiting(producer, topic, out, key.encode())
        producer.poll(0)

    return totals_batch


WORKLOADS: dict[str, Callable[[], HandBatch]] = {"copier": copier, "running_totals": running_totals}


def producer_config(bootstrap: str) -> dict[str, Any]:
    """Like the KafkaRunner's at_least_once producer (pipeline/kafka/clients.py), without a transactional id."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "partitioner": "murmur2_random",
    }
