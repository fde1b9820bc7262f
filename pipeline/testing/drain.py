"""Reading a run back from Kafka for the oracle: topics drained with read_committed to their high watermarks, the
group's committed offsets, and a concurrent read_committed observer of the output while faults are injected.

Everything read here is detached into the oracle's plain records (pipeline.testing.oracle), which does the judging.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.app import App
from pipeline.core.deadletter import dead_letter_topic
from pipeline.kafka.offsets import TailReader, high_watermarks, low_watermarks, read_to_end
from pipeline.state.changelog import changelog_topic
from pipeline.testing.oracle import KafkaRecord, RunData, TopicDump


# -- draining a finished run -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dead_letter: str
    changelog: str | None  # None: stateless app
    more_inputs: tuple[str, ...] = ()  # several inputs: the other co-partitioned topics (inputs, then tables)
    global_tables: tuple[tuple[str, str], ...] = ()  # (name, topic) of each global table

    @staticmethod
    def for_app(
        app: App,
        *,
        input_topic: str | None = None,
        output_topic: str | None = None,
        dead_letter_topic_name: str | None = None,
        changelog_topic_name: str | None = None,
    ) -> Topics:
        return Topics(
            input=input_topic or app.input_topic,
            output=output_topic or app.output_topic,
            dead_letter=dead_letter_topic_name or dead_letter_topic(app.name),
            changelog=(changelog_topic_name or changelog_topic(app.name)) if app.stateful else None,
            more_inputs=app.co_partitioned[1:],
            global_tables=tuple((name, t.topic) for name, t in app.global_table_specs.items()),
        )


def drain_run(config: Mapping[str, Any], topics: Topics, group_id: str, timeout_s: float) -> RunData:
    admin = AdminClient(dict(config))
    names = [
        topics.input,
        topics.output,
        topics.dead_letter,
        *topics.more_inputs,
        *(t for _, t in topics.global_tables),
    ]
    if topics.changelog is not None:
        names.append(topics.changelog)
    with ThreadPoolExecutor(max_workers=min(8, len(names)), thread_name_prefix="eos-drain") as pool:
        dumps = dict(
            zip(names, pool.map(lambda topic: drain_topic(admin, config, topic, timeout_s), names), strict=True)
        )
    inputs = dumps[topics.input]
    if not inputs.exists:
        raise LookupError(f"input topic {topics.input} does not exist")
    return RunData(
        input_topic=topics.input,
        inputs=inputs,
        outputs=dumps[topics.output],
        dead_letters=dumps[topics.dead_letter],
        changelog=dumps[topics.changelog] if topics.changelog is not None else None,
        committed=committed_offsets(config, group_id, topics.input, inputs.partitions, timeout_s),
        more_inputs={topic: dumps[topic] for topic in topics.more_inputs},
        more_committed={
            topic: committed_offsets(config, group_id, topic, dumps[topic].partitions, timeout_s)
            for topic in topics.more_inputs
        },
        global_tables={name: dumps[topic] for name, topic in topics.global_tables},
    )


def drain_topic(admin: AdminClient, config: Mapping[str, Any], topic: str, timeout_s: float) -> TopicDump:
    """Every committed record of `topic`, read with a dedicated read_committed consumer up to the high watermarks."""
    partitions = topic_partitions(admin, topic, timeout_s)
    if partitions is None:
        return TopicDump(topic, [], {}, exists=False)
    starts = low_watermarks(admin, topic, partitions, timeout_s)
    ends = high_watermarks(admin, topic, partitions, timeout_s)
    consumer = Consumer(reader_config(config))
    try:
        reader = TailReader(consumer, topic, starts, ends)
        records = [_detach(message) for message in read_to_end(reader, timeout_s)]
    finally:
        consumer.close()
    return TopicDump(topic, records, ends)


def topic_partitions(admin: AdminClient, topic: str, timeout_s: float) -> list[int] | None:
    """The partitions of `topic`; None if it does not exist."""
    metadata = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or (metadata.error and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if metadata.error:
        raise KafkaException(metadata.error)
    return sorted(metadata.partitions)


def reader_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A consumer that only reads by assignment: throwaway group (librdkafka wants one), nothing ever committed."""
    return {
        **config,
        "group.id": f"eos-checker-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }


def committed_offsets(
    config: Mapping[str, Any], group_id: str, topic: str, partitions: Sequence[int], timeout_s: float
) -> dict[int, int | None]:
    """The group's committed offset per partition (None: none). Joins no group and commits nothing."""
    consumer = Consumer({**config, "group.id": group_id, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    finally:
        consumer.close()
    for tp in committed:
        if tp.error:
            raise KafkaException(tp.error)
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in committed}


def _detach(message: Any) -> KafkaRecord:
    return KafkaRecord(
        partition=message.partition(),
        offset=message.offset(),
        key=message.key(),
        value=message.value(),
        headers=tuple(message.headers() or ()),
        timestamp_ms=message.timestamp()[1],
    )


# -- the concurrent observer --------------------------------------------------------------------------------------
class Observer:
    """Reads a topic with read_committed in a background thread, from its beginning, until stopped, and keeps
    every record it sees. The contract: none of them may be missing from the final drain."""

    def __init__(
        self, bootstrap: str, topic: str, *, extra_config: Mapping[str, Any] | None = None, timeout_s: float = 30.0
    ) -> None:
        self.topic = topic
        self.records: list[KafkaRecord] = []
        self.errors: list[str] = []  # fatal consumer errors; transient ones (broker restarts) are expected
        self._config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
        self._timeout_s = timeout_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"eos-observer-{topic}", daemon=True)
        self._partitions: list[int] = []

    def start(self) -> Observer:
        partitions = topic_partitions(AdminClient(dict(self._config)), self.topic, self._timeout_s)
        if partitions is None:
            raise LookupError(f"cannot observe {self.topic}: it does not exist")
        self._partitions = partitions
        self._thread.start()
        return self

    def stop(self) -> list[KafkaRecord]:
        self._stopping.set()
        self._thread.join(self._timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"observer of {self.topic} did not stop within {self._timeout_s}s")
        return self.records

    def __enter__(self) -> Observer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        consumer = Consumer(reader_config(self._config))
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self._partitions])
            while not self._stopping.is_set():
                for message in consumer.consume(num_messages=1000, timeout=0.2):
                    if (error := message.error()) is None:
                        self.records.append(_detach(message))
                    elif error.fatal():
                        self.errors.append(str(error))
                        return
        finally:
            consumer.close()


def observe(
    bootstrap: str, topic: str, *, extra_config: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> Observer:
    """Starts an Observer of `topic` (which must exist); `stop()` it after the fault run, before `verify`."""
    return Observer(bootstrap, topic, extra_config=extra_config, timeout_s=timeout_s).start()
