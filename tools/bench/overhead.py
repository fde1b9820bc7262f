"""The per-record cost without a broker: `KafkaTask.process` over in-memory messages, beside the same work written
by hand (tools/bench/hand.py) over the same messages. Both produce into a real confluent-kafka producer that never
connects (its queue is purged after each pass), so librdkafka's produce call, headers included, is counted; a
transaction costs nothing. Measured in CPU time of the calling thread (time.thread_time), best of 5 passes: stable to
a few per cent on a loaded machine where broker runs vary by ±30 %, so it is the number to compare before and after
a change to the hot path, and ours / hand is the framework's per-record price with the produce calls in it.

    python -m tools.bench --overhead            # best of 5 passes over 100k records, per example app
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, Message, Producer

from pipeline import settings as settings_module
from pipeline.app import App
from pipeline.core.lifecycle import Phase
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.serde import background_registry_lookups
from pipeline.settings import Settings
from pipeline.sinks.kafka.task import KafkaTask, KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction
from pipeline.testing.inputs import ProducedRecord
from tools.bench import hand

BATCH = 5_000


class NullProducer:
    """Counts what it is given; a transaction costs nothing (tools/bench/expiry.py's stand-in)."""

    def __init__(self) -> None:
        self.produced = 0

    def produce(self, *args: object, **kwargs: object) -> None:
        self.produced += 1

    def poll(self, timeout: float = 0) -> int:
        return 0

    def begin_transaction(self) -> None:
        pass


class LocalProducer(Producer):
    """A real producer whose broker never answers: produce() queues in librdkafka, a transaction costs nothing."""

    def __init__(self) -> None:
        super().__init__(
            {
                "bootstrap.servers": "127.0.0.1:9",  # discard: nothing listens, nothing is sent
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 4_000_000,
                "log_level": 0,
            }
        )

    def begin_transaction(self) -> None:
        pass

    def queued_and_purged(self) -> int:
        """The outputs given since the last call, dropped."""
        queued = len(self)
        self.purge()
        self.poll(0)
        return queued


@dataclass(frozen=True)
class Overhead:
    app: str
    records: int
    produced: int
    us_per_record: float  # ours: KafkaTask.process, CPU time of the calling thread
    hand_produced: int = 0
    hand_us_per_record: float = 0.0  # the same work by hand (tools/bench/hand.py)

    @property
    def ratio(self) -> float:
        """hand / ours in cost per record: what `eos / hand` in records per second would be if only the per-record
        path counted."""
        return self.hand_us_per_record / self.us_per_record if self.us_per_record else 0.0


def messages_for(app: App, records: int, partitions: int = 1) -> list[Consumed]:
    """`records` messages of app's generator over `partitions` input partitions, each in the partition the generator
    gives it (running_totals: by account, as on a broker), offsets counted per partition."""
    # The benched Apps have one input: (partition, key, value[, timestamp ms]) records.
    generated = cast(Iterable[ProducedRecord], app.generate(records, partitions, 0) if app.generate else [])
    offsets = [0] * partitions
    messages = []
    for p, key, value, *timestamp in generated:
        messages.append(
            Message(
                topic=app.input_topic,
                partition=p,
                offset=offsets[p],
                key=key,
                value=value,
                timestamp=(1, timestamp[0] if timestamp else 0),
            )
        )
        offsets[p] += 1
    return cast(list[Consumed], messages)  # built with their topic, partition, offset and timestamp: records


def measure(app: App, records: int = 100_000, passes: int = 5, workload: str | None = None) -> Overhead:
    """Best of `passes` runs of process() over `records` messages, in transactions of BATCH records; with
    `workload` (a name in tools/bench/hand.py), the same for its hand loop, passes interleaved."""
    messages = messages_for(app, records)
    settings = settings_module.load(env={}, bootstrap_servers="unused:9092", app_id="overhead")
    producer = LocalProducer()
    best = hand_best = float("inf")
    produced = hand_produced = 0
    try:
        for _ in range(passes):
            seconds, produced = _ours(app, settings, messages, producer)
            best = min(best, seconds)
            if workload is not None:
                seconds, hand_produced = _by_hand(hand.WORKLOADS[workload](), messages, producer)
                hand_best = min(hand_best, seconds)
    finally:
        producer.queued_and_purged()
    n = max(len(messages), 1)
    hand_us = hand_best / n * 1e6 if workload is not None else 0.0
    return Overhead(app.name, len(messages), produced, best / n * 1e6, hand_produced, hand_us)


def _ours(app: App, settings: Settings, messages: list[Consumed], producer: LocalProducer) -> tuple[float, int]:
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
    txn = Transaction(producer, settings, "overhead")  # a stand-in: takes what a task sends
    task = KafkaTask(ctx, 0, txn)
    task.start(0)
    if task.phase is Phase.RESTORING:
        task.restored(task.state, None, None)  # no restore: the state starts empty
        task.phase = Phase.RUNNING  # no consumer to seek: the position is the start
    started = time.thread_time()
    for i in range(0, len(messages), BATCH):
        task.process(messages[i : i + BATCH])
        txn.poll()  # the delivery reports, once per poll (KafkaRunner._dispatch)
        task.state.commit()  # what a commit does to the state; the changelog writes are not counted
        task.batch_open = False
        txn.end()
    return time.thread_time() - started, producer.queued_and_purged()


def _by_hand(work: hand.HandBatch, messages: list[Consumed], producer: LocalProducer) -> tuple[float, int]:
    started = time.thread_time()
    for i in range(0, len(messages), BATCH):
        work(messages[i : i + BATCH], producer, "overhead-out")
    return time.thread_time() - started, producer.queued_and_purged()


# -- the partition scale, per-process producer (issue 33) -------------------------------------------------------------
COMMIT_RECORDS = 15_000  # records per commit: ~100 ms of a 150k rec/s drain


@dataclass(frozen=True)
class Scale:
    app: str
    partitions: int
    records: int
    us_per_record: float


def measure_scale(app: App, partitions: int, records: int = 100_000, passes: int = 5) -> Scale:
    """The instance's per-record CPU on the Python side with `partitions` tasks in one transaction (PRODUCERS=
    per_process): polls of BATCH records handed over partition by partition (the runner's _by_partition and
    _dispatch), and every COMMIT_RECORDS the commit's steps 1 and 4 (prepare_commit, committed) for every task in
    it. What grows with the partition count in the instance shows here as cost per record; the broker's side, the
    fetches and librdkafka's own threads do not (tools/bench/partitions.py measures those)."""
    messages = messages_for(app, records, partitions)
    settings = settings_module.load(env={}, bootstrap_servers="unused:9092", app_id="overhead")
    producer = LocalProducer()
    best = float("inf")
    try:
        for _ in range(passes):
            best = min(best, _scale_pass(app, settings, messages, producer, partitions))
    finally:
        producer.queued_and_purged()
    return Scale(app.name, partitions, len(messages), best / max(len(messages), 1) * 1e6)


def _scale_pass(
    app: App, settings: Settings, messages: list[Consumed], producer: LocalProducer, partitions: int
) -> float:
    metrics = Metrics()
    ctx = KafkaTaskContext(
        app, settings, "overhead", app.input_topic, app.output_topic, "overhead-changelog", "overhead-dlq",
        cast(Consumer, None), metrics,
    )  # fmt: skip
    txn = Transaction(producer, settings, "overhead")
    tasks = {p: KafkaTask(ctx, p, txn) for p in range(partitions)}
    for task in tasks.values():
        task.start(0)
        if task.phase is Phase.RESTORING:
            task.restored(task.state, None, None)
            task.phase = Phase.RUNNING
    since_commit = 0
    started = time.thread_time()
    for i in range(0, len(messages), BATCH):
        batches: dict[int, list[Consumed]] = defaultdict(list)
        for m in messages[i : i + BATCH]:
            batches[m.partition()].append(m)
        background = background_registry_lookups.set(True)  # once per poll, as KafkaRunner._dispatch does
        for p, batch in batches.items():
            tasks[p].process(batch)
        background_registry_lookups.reset(background)
        txn.poll()  # the delivery reports, once per poll (KafkaRunner._dispatch)
        since_commit += BATCH
        if since_commit >= COMMIT_RECORDS:
            _commit_steps(txn)
            since_commit = 0
        producer.queued_and_purged()  # the broker's side is not measured here
    _commit_steps(txn)
    return time.thread_time() - started


def _commit_steps(txn: Transaction) -> None:
    """pipeline/sinks/kafka/commit.py's commit_transaction without the broker's calls (steps 2 and 3)."""
    [offset for task in txn.participants for offset in task.prepare_commit()]
    for task in txn.end():
        task.committed()
