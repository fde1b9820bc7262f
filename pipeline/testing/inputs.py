"""Input generators for the example apps, shared by the tests, the demo, the benchmarks and the chaos runner.

Deterministic: the same arguments produce the same records in the same partitions. Records are written with an
idempotent, acks=all producer (not transactional: plain input, as most upstream systems write it), in large
batches, flushed before returning.

Partitioning:
- running totals: explicit partition = crc32(key) % partitions. An account's records must all land in one
  partition (its state lives there), in every process: Python's hash() of a str changes per process.
- copier: round robin, record i to partition i % partitions, so every partition gets its share.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.clients import produce_waiting

ProducedRecord = tuple[int, bytes, bytes] | tuple[int, bytes, bytes, int]  # (partition, key, value[, timestamp ms])


class ProduceError(RuntimeError):
    pass


# -- topics ---------------------------------------------------------------------------------------------------------
def create_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    replication: int = 1,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    extra_config: Mapping[str, Any] | None = None,
) -> None:
    """Creates each topic {name: partitions} unless it exists, then waits until every partition has a leader.
    An existing topic with another partition count is an error (the caller's assumptions would be wrong)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(extra_config or {})})
    new_topics = [NewTopic(name, n, replication, config=dict(config or {})) for name, n in topics.items()]
    futures = admin.create_topics(new_topics, operation_timeout=timeout_s, request_timeout=timeout_s)
    for future in futures.values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_for_leaders(admin, topics, timeout_s)


def _wait_for_leaders(admin: AdminClient, topics: Mapping[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = dict(topics)
    while waiting:
        metadata = admin.list_topics(timeout=timeout_s).topics
        for name, partitions in list(waiting.items()):
            topic = metadata.get(name)
            if topic is None or topic.error is not None:
                continue
            if topic.partitions and len(topic.partitions) != partitions:
                raise ValueError(f"topic {name} exists with {len(topic.partitions)} partitions, not {partitions}")
            if len(topic.partitions) == partitions and all(p.leader >= 0 for p in topic.partitions.values()):
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"topics without leaders after {timeout_s:.0f}s: {sorted(waiting)}")
        if waiting:
            time.sleep(0.1)


# -- running totals ---------------------------------------------------------------------------------------------------
def account_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


def running_totals_records(
    n: int,
    *,
    partitions: int,
    accounts: int = 50,
    seed: int = 0,
    poison_every: int = 0,
    value_size: int | None = None,
) -> Iterator[ProducedRecord]:
    """Record i: key "account-<k>", value {"id": i, "amount": <int>}, padded to about value_size bytes.
    With poison_every=k, records k-1, 2k-1, ... are poison, alternately invalid JSON (the decode fails) and
    {"id": i, "amount": "not-a-number"} (process raises)."""
    rng = random.Random(seed)
    for i in range(n):
        key = f"account-{rng.randrange(accounts)}".encode()
        amount = rng.randint(-100, 1000)
        poison_number = (i + 1) // poison_every if poison_every and (i + 1) % poison_every == 0 else 0
        if poison_number % 2 == 1:
            value = b'{"id": %d, "amount": ' % i  # cut off: not JSON
        elif poison_number:
            value = _padded({"id": i, "amount": "not-a-number"}, value_size)
        else:
            value = _padded({"id": i, "amount": amount}, value_size)
        yield account_partition(key, partitions), key, value


def _padded(value: dict[str, Any], size: int | None) -> bytes:
    encoded = orjson.dumps(value)
    missing = (size or 0) - len(encoded) - len(',"pad":""')
    return orjson.dumps({**value, "pad": "x" * missing}) if missing > 0 else encoded


def produce_running_totals(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    partitions: int,
    accounts: int = 50,
    seed: int = 0,
    poison_every: int = 0,
    value_size: int | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Produces n running-totals records (see running_totals_records); returns the count per partition."""
    records = running_totals_records(
        n, partitions=partitions, accounts=accounts, seed=seed, poison_every=poison_every, value_size=value_size
    )
    return produce(bootstrap, topic, records, partitions=partitions, extra_config=extra_config)


# -- copier ------------------------------------------------------------------------------------------------------------
def copier_records(n: int, *, partitions: int, value_size: int = 100, seed: int = 0) -> Iterator[ProducedRecord]:
    """Record i: key b"<i>", value_size random bytes, partition i % partitions."""
    rng = random.Random(seed)
    for i in range(n):
        yield i % partitions, b"%d" % i, rng.randbytes(value_size)


def produce_copier(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    partitions: int,
    value_size: int = 100,
    seed: int = 0,
    extra_config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    records = copier_records(n, partitions=partitions, value_size=value_size, seed=seed)
    return produce(bootstrap, topic, records, partitions=partitions, extra_config=extra_config)


# -- producing ---------------------------------------------------------------------------------------------------------
def producer_config(bootstrap: str, extra_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        **(extra_config or {}),
    }


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[ProducedRecord],
    *,
    partitions: int,
    extra_config: Mapping[str, Any] | None = None,
    timeout_s: float = 60.0,
) -> dict[int, int]:
    """Writes (partition, key, value[, timestamp ms]) records and waits for all of them; the count delivered per
    partition. Without a timestamp the producer stamps the record when it sends it."""
    producer = Producer(producer_config(bootstrap, extra_config))
    delivered: Counter[int] = Counter()
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Any) -> None:
        if error is None:
            delivered[message.partition()] += 1
        else:
            failures.append(error)

    for partition, key, value, *timestamp in records:
        _produce_one(producer, topic, partition, key, value, on_delivery, *timestamp)
    undelivered = producer.flush(timeout_s)
    if failures or undelivered:
        first = f", first error: {failures[0]}" if failures else ""
        raise ProduceError(f"{topic}: {len(failures)} failed and {undelivered} undelivered records{first}")
    return {p: delivered[p] for p in range(partitions)}


def _produce_one(
    producer: Producer, topic: str, partition: int, key: bytes, value: bytes, on_delivery: Any, timestamp: int = 0
) -> None:
    produce_waiting(producer, topic, value, key, partition=partition, on_delivery=on_delivery, timestamp=timestamp)
    producer.poll(0)
