"""An in-memory stand-in for the Kafka clients KafkaTask uses, for the test driver (pipeline/testing/driver.py).

Only what the task calls, with the semantics the exactly-once protocol relies on: a transactional producer whose
records and offsets become visible together on commit and vanish on abort (their offsets stay used, as in Kafka),
and whose transactional.id is fenced by the next producer that calls init_transactions with it. What a
read_committed reader would see is `MemoryBroker.committed_records`, as plain KafkaRecords the oracle can check.

Not Kafka: no network, no batching, no consumer group protocol; the default partitioner (partition -1) is
crc32(key) % partitions, not librdkafka's murmur2.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.testing.oracle.records import KafkaRecord


@dataclass
class MemoryBroker:
    """Committed records per (topic, partition), committed group offsets, producer epochs per transactional.id."""

    partitions: dict[str, int] = field(default_factory=dict)  # topic -> partition count
    records: dict[tuple[str, int], list[KafkaRecord]] = field(default_factory=lambda: defaultdict(list))
    next_offsets: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    group_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    produced: list[tuple[str, KafkaRecord]] = field(default_factory=list)  # every produce, committed or not

    def create(self, topic: str, partitions: int) -> None:
        self.partitions.setdefault(topic, partitions)

    def reserve(self, topic: str, partition: int) -> int:
        """The offset of the next record of (topic, partition), taken whether it is committed or not."""
        offset = self.next_offsets[(topic, partition)]
        self.next_offsets[(topic, partition)] = offset + 1
        return offset

    def append(self, topic: str, record: KafkaRecord) -> None:
        self.records[(topic, record.partition)].append(record)

    def committed_records(self, topic: str) -> list[KafkaRecord]:
        return sorted(
            (r for p in range(self.partitions.get(topic, 0)) for r in self.records[(topic, p)]), key=lambda r: r.coord
        )

    def ends(self, topic: str) -> dict[int, int]:
        return {p: self.next_offsets[(topic, p)] for p in range(self.partitions.get(topic, 0))}


class Delivered:
    """What a delivery report hands on_delivery (the task reads the checkpoint's offset from it)."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class MemoryProducer:
    def __init__(self, broker: MemoryBroker, transactional_id: str | None) -> None:
        self.broker = broker
        self.transactional_id = transactional_id
        self.epoch = -1
        self._open: list[tuple[str, KafkaRecord]] = []
        self._offsets: list[TopicPartition] = []

    def init_transactions(self, *args: Any) -> None:
        """Fences every earlier producer with this transactional.id and drops its open transaction."""
        if self.transactional_id is None:  # not transactional: nothing to fence
            return
        self.broker.epochs[self.transactional_id] += 1
        self.epoch = self.broker.epochs[self.transactional_id]

    def begin_transaction(self, *args: Any) -> None:
        self._check_epoch()
        self._open, self._offsets = [], []

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        callback: Callable[[Any, Delivered], None] | None = None,
        on_delivery: Callable[[Any, Delivered], None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's signature, in its order: the Kafka sink's hot loop passes every argument positionally."""
        on_delivery = on_delivery or callback
        if partition < 0:
            partition = zlib.crc32(key or b"") % self.broker.partitions.get(topic, 1)
        record = KafkaRecord(
            partition, self.broker.reserve(topic, partition), key, value, tuple(headers or ()), timestamp
        )
        self.broker.produced.append((topic, record))
        if self.transactional_id is None:
            self.broker.append(topic, record)
        else:
            self._open.append((topic, record))
        if on_delivery is not None:
            on_delivery(None, Delivered(topic, partition, record.offset))

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], *args: Any) -> None:
        self._check_epoch()
        self._offsets.extend(offsets)

    def commit_transaction(self, *args: Any) -> None:
        self._check_epoch()
        for topic, record in self._open:
            self.broker.append(topic, record)
        for tp in self._offsets:
            self.broker.group_offsets[(tp.topic, tp.partition)] = tp.offset
        self._open, self._offsets = [], []

    def abort_transaction(self, *args: Any) -> None:
        self._open, self._offsets = [], []

    def flush(self, *args: Any) -> int:
        return 0

    def poll(self, *args: Any) -> int:
        return 0

    def _check_epoch(self) -> None:
        if self.transactional_id is not None and self.epoch != self.broker.epochs[self.transactional_id]:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer (test driver)", fatal=True))


class MemoryConsumer:
    """The input consumer as the task sees it: positions moved by seek, pauses, offsets committed (at-least-once)."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.positions: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset to fetch
        self.paused: set[int] = set()

    def consumer_group_metadata(self) -> object:
        return None

    def seek(self, tp: TopicPartition) -> None:
        self.positions[(tp.topic, tp.partition)] = max(tp.offset, 0)  # OFFSET_BEGINNING (-2): the beginning

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        """(low, high) as a consumer knows them: everything is fetched at once here, so the high is the end."""
        return 0, self.broker.next_offsets[(tp.topic, tp.partition)]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused.update(tp.partition for tp in tps)

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused.difference_update(tp.partition for tp in tps)

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None:
        for tp in offsets or ():
            self.broker.group_offsets[(tp.topic, tp.partition)] = tp.offset
