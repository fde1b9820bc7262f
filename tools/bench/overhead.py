"""The framework's own cost per record, without a broker: `KafkaTask.process` over in-memory messages into a
producer that drops everything. Stable to a few per cent where broker runs on a shared 2-core machine vary by ±30 %,
so it is the number to compare before and after a change to the hot path.

    python -m tools.bench --overhead            # best of 5 passes over 100k records, per example app
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, Message, Producer

from pipeline import settings as settings_module
from pipeline.app import App
from pipeline.core.lifecycle import Phase
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.sinks.kafka.task import KafkaTask, KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction
from pipeline.testing.inputs import ProducedRecord

BATCH = 5_000


class NullProducer:
    """Counts what it is given; a transaction costs nothing."""

    def __init__(self) -> None:
        self.produced = 0

    def produce(self, *args, **kwargs) -> None:
        self.produced += 1

    def poll(self, timeout: float = 0) -> int:
        return 0

    def begin_transaction(self) -> None:
        pass


@dataclass(frozen=True)
class Overhead:
    app: str
    records: int
    produced: int
    us_per_record: float


def messages_for(app: App, records: int) -> list[Consumed]:
    # The benched Apps have one input: (partition, key, value[, timestamp ms]) records.
    generated = cast(Iterable[ProducedRecord], app.generate(records, 1, 0) if app.generate else [])
    messages = [
        Message(
            topic=app.input_topic,
            partition=0,
            offset=i,
            key=key,
            value=value,
            timestamp=(1, timestamp[0] if timestamp else 0),
        )
        for i, (_, key, value, *timestamp) in enumerate(generated)
    ]
    return cast(list[Consumed], messages)  # built with their topic, partition, offset and timestamp: records


def measure(app: App, records: int = 100_000, passes: int = 5) -> Overhead:
    """Best of `passes` runs of process() over `records` messages, in transactions of BATCH records."""
    messages = messages_for(app, records)
    settings = settings_module.load(env={}, bootstrap_servers="unused:9092", app_id="overhead")
    best, produced = float("inf"), 0
    for _ in range(passes):
        producer = NullProducer()
        ctx = KafkaTaskContext(
            app,
            settings,
            "overhead",
            app.input_topic,
            app.output_topic,
            "overhead-changelog",
            "overhead-dlq",
            cast(Consumer, None),  # no consumer: nothing is fetched or sought here
            Metrics(),
        )
        txn = Transaction(cast(Producer, producer), settings, "overhead")  # a stand-in: takes what a task sends
        task = KafkaTask(ctx, 0, txn)
        task.start(0)
        if task.phase is Phase.RESTORING:
            task.restored(task.state, None, None)  # no restore: the state starts empty
            task.phase = Phase.RUNNING  # no consumer to seek: the position is the start
        started = time.perf_counter()
        for i in range(0, len(messages), BATCH):
            task.process(messages[i : i + BATCH])
            task.state.commit()  # what a commit does to the state; the changelog writes are not counted
            task.batch_open = False
            txn.end()
        best = min(best, time.perf_counter() - started)
        produced = producer.produced
    return Overhead(app.name, len(messages), produced, best / max(len(messages), 1) * 1e6)
