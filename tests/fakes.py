"""The test doubles of the broker-free tests, in one place: stand-ins for the Kafka clients and for the clock.

They test a protocol (what is called, in which order, what happens on each kind of error), never Kafka: whatever
claims exactly-once is proven against a real broker, in the tests marked `kafka`. Messages are real
`confluent_kafka.Message` objects (`kafka_message`), not stand-ins.

- `FakeProducer`: records every call, raises the errors queued for a method, delivers what it produced at flush.
- `NullProducer`: does nothing and costs no time; remembers when each commit happened.
- `FakeConsumer`: records the consumer calls of the protocol (seek, pause, resume, commit); hands out no records;
  answers what a consumer knows locally (positions, cached watermarks, the assignment) as a test sets it.
- `FeedConsumer`: hands out given records, at once or as they arrive on a `FakeClock`.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

# What FakeConsumer.consumer_group_metadata() answers: the tests check it reaches send_offsets_to_transaction as is.
GROUP_METADATA = object()


def kafka_exception(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "injected", **flags))


# The kinds of producer error the protocol tells apart (pipeline/kafka/errors.py), as kafka_exception(**KIND).
RETRIABLE = dict(code=KafkaError._TIMED_OUT, retriable=True)
ABORTABLE = dict(code=KafkaError._STATE, txn_requires_abort=True)
FENCED = dict(code=KafkaError._FENCED, fatal=True)


def kafka_message(
    offset: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    *,
    partition: int = 0,
    topic: str = "in",
    timestamp_ms: int = 1_700_000_000_000,
    headers: list[tuple[str, bytes]] | None = None,
) -> Message:
    """A record as a consumer hands it out."""
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=(1, timestamp_ms),  # 1: TIMESTAMP_CREATE_TIME
    )


class Calls(list[tuple[str, tuple[Any, ...], dict[str, Any]]]):
    """(name, args, kwargs) of every call on the fakes, in order."""

    def names(self) -> list[str]:
        return [name for name, _, _ in self]

    def count(self, name: str) -> int:  # type: ignore[override]
        return self.names().count(name)

    def produced(self, topic: str | None = None) -> list[dict[str, Any]]:
        rows = [{"topic": a[0], "value": a[1], "key": a[2], **kw} for name, a, kw in self if name == "produce"]
        return [r for r in rows if topic is None or r["topic"] == topic]


class FakeClock:
    """time.monotonic(), time.time(), time.perf_counter() and time.sleep() of the modules under test, and a clock
    function (calling it gives the time). Only sleeps and the fakes' waits move it."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Hang:
    """A FakeProducer call that blocks, as librdkafka's did after a coordinator died (pipeline/kafka/bounded.py), until
    `released` is set or `at_most_s` passed; then it goes through."""

    def __init__(self, at_most_s: float = 10.0) -> None:
        self.released = threading.Event()
        self.at_most_s = at_most_s


class FakeProducer:
    """Records every call in `calls` (shared with a FakeConsumer, the order of both is one list); `fail(method, ...)`
    queues errors, raised one per call. Produced records get offsets from `first_offset` on, are kept in `records`,
    and are delivered at flush, or fail delivery with `fail_delivery`."""

    def __init__(
        self,
        calls: Calls | None = None,
        transactional_id: str | None = None,
        *,
        first_offset: int = 100,
        fail_delivery: bool = False,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
        no_offset_for: Collection[str] = (),
    ) -> None:
        """`on_delivery`: the producer's default delivery callback (librdkafka's dr_msg_cb), for messages produced
        without one of their own. `no_offset_for`: topics whose messages are reported delivered without an offset,
        as librdkafka reports a message it acknowledged implicitly (sinks/kafka/transaction.py: Deliveries)."""
        self.calls = Calls() if calls is None else calls
        self.transactional_id = transactional_id
        self.failures: dict[str, list[BaseException | Hang | None]] = {}  # method -> exceptions to raise, one per call
        self.records: list[Message] = []
        self._undelivered: list[tuple[Message, Callable[[KafkaError | None, Message], None]]] = []
        self._next_offset = first_offset
        self._fail_delivery = fail_delivery
        self._on_delivery = on_delivery
        self._no_offset_for = frozenset(no_offset_for)

    def fail(self, method: str, *errors: BaseException | Hang | None) -> None:
        """One per call of `method`, in order; None: that call goes through; a Hang: it blocks first."""
        self.failures.setdefault(method, []).extend(errors)

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.failures.get(name) and (error := self.failures[name].pop(0)) is not None:
            if isinstance(error, Hang):
                error.released.wait(error.at_most_s)
                return
            raise error

    def init_transactions(self, *args: Any) -> None:
        self._record("init_transactions", *args)

    def begin_transaction(self, *args: Any) -> None:
        self._record("begin_transaction", *args)

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's signature, in its order: the Kafka sink's hot loop passes every argument positionally."""
        on_delivery = on_delivery or callback
        extra = {"on_delivery": on_delivery} if on_delivery is not None else {}
        self._record("produce", topic, value, key, partition=partition, headers=headers, **extra)
        message = kafka_message(self._next_offset, key, value, topic=topic, partition=partition, headers=headers)
        self._next_offset += 1
        self.records.append(message)
        if (on_delivery := on_delivery or self._on_delivery) is not None:
            if topic in self._no_offset_for:
                message = kafka_message(OFFSET_INVALID, key, value, topic=topic, partition=partition)
            self._undelivered.append((message, on_delivery))

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._record("send_offsets_to_transaction", *args)

    def commit_transaction(self, *args: Any) -> None:
        self._record("commit_transaction", *args)

    def abort_transaction(self, *args: Any) -> None:
        self._record("abort_transaction", *args)

    def flush(self, *args: Any) -> int:
        self._record("flush", *args)
        error = KafkaError(KafkaError._MSG_TIMED_OUT) if self._fail_delivery else None
        for message, on_delivery in self._undelivered:
            on_delivery(error, message)
        self._undelivered = []
        return 0

    def poll(self, *args: Any) -> int:
        return 0  # not recorded: called after every batch, carries no protocol meaning


class NullProducer:
    """A transactional producer that does nothing and costs no time; `commits` holds the clock's time of each
    commit_transaction."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.commits: list[float] = []

    def init_transactions(self, timeout: float | None = None) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group: object, timeout: Any = None) -> None:
        pass

    def commit_transaction(self, timeout: float | None = None) -> None:
        self.commits.append(self.clock.now)


class FakeConsumer:
    """The group consumer as the protocol uses it, without records. Records seek, pause, resume (and commit) in
    `calls`; keeps librdkafka's rule that matters for take-overs: a pause survives unassign/assign until resume().
    committed() answers `committed_offset` for every partition (OFFSET_INVALID: nothing committed)."""

    def __init__(self, calls: Calls | None = None, committed_offset: int = OFFSET_INVALID) -> None:
        self.calls = Calls() if calls is None else calls
        self.committed_offset = committed_offset
        self.paused: set[int] = set()
        # What librdkafka knows locally, per (topic, partition); unset: unknown (OFFSET_INVALID), as before any fetch.
        self.positions: dict[tuple[str, int], int] = {}
        self.watermarks: dict[tuple[str, int], tuple[int, int]] = {}  # cached (low, high)
        self.assigned: set[tuple[str, int]] = set()

    @property
    def seeks(self) -> list[tuple[int, int]]:
        """(partition, offset) of every seek, in order."""
        return [(args[1], args[2]) for name, args, _ in self.calls if name == "seek"]

    def moves(self) -> list[tuple[str, int, int | None]]:
        """The seeks and resumes, in order: (name, partition, offset or None)."""
        return [
            (name, args[1], args[2] if name == "seek" else None)
            for name, args, _ in self.calls
            if name in ("seek", "resume")
        ]

    def consumer_group_metadata(self) -> object:
        return GROUP_METADATA

    def committed(self, tps: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in tps]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition) -> None:
        self.calls.append(("seek", (tp.topic, tp.partition, tp.offset), {}))

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}
        self.calls += [("pause", (tp.topic, tp.partition), {}) for tp in tps]

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}
        self.calls += [("resume", (tp.topic, tp.partition), {}) for tp in tps]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)) for tp in tps
        ]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        assert cached, "the poll loop never asks the broker"
        return self.watermarks.get((tp.topic, tp.partition), (-1001, -1001))

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for topic, p in sorted(self.assigned)]

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None:
        self.calls.append(("consumer.commit", ([(tp.topic, tp.partition, tp.offset) for tp in offsets or ()],), {}))


class FeedConsumer:
    """Hands out records as they arrive, (time, message) on `clock`: poll() waits for the first one at most
    `timeout`, consume() takes what is there (and, like librdkafka, waits `timeout` for a full batch). Every wait is
    recorded in `waits` with the clock at its start, every commit in `committed_offsets`."""

    def __init__(self, clock: FakeClock, arrivals: Iterable[tuple[float, Message]] = ()) -> None:
        self.clock = clock
        self._arrivals = [(at, i, m) for i, (at, m) in enumerate(arrivals)]
        heapq.heapify(self._arrivals)
        self._position = 0
        self.waits: list[tuple[float, float]] = []  # (clock at the call, timeout)
        self.committed_offsets: list[tuple[float, list[TopicPartition] | None]] = []

    @classmethod
    def of(cls, records: Iterable[Message]) -> FeedConsumer:
        """All of them there from the start, in offset order, as a read_committed consumer assigned to them."""
        clock = FakeClock()
        return cls(clock, [(clock.now, m) for m in sorted(records, key=Message.offset)])

    def _ready(self, limit: int) -> list[Message]:
        out = []
        while self._arrivals and self._arrivals[0][0] <= self.clock.now and len(out) < limit:
            out.append(heapq.heappop(self._arrivals)[2])
        if out:
            self._position = out[-1].offset() + 1
        return out

    def _ready_now(self) -> bool:
        return bool(self._arrivals) and self._arrivals[0][0] <= self.clock.now

    def poll(self, timeout: float) -> Message | None:
        self.waits.append((self.clock.now, timeout))
        if not self._ready_now():
            next_arrival = self._arrivals[0][0] if self._arrivals else float("inf")
            self.clock.now = min(self.clock.now + timeout, max(self.clock.now, next_arrival))
        ready = self._ready(1)
        return ready[0] if ready else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.waits.append((self.clock.now, timeout))
        ready = self._ready(num_messages)
        if len(ready) < num_messages and timeout > 0:  # librdkafka: waits for a full batch or the timeout
            self.clock.now += timeout
            ready += self._ready(num_messages - len(ready))
        return ready

    def assign(self, partitions: list[TopicPartition]) -> None:
        start = min((tp.offset for tp in partitions), default=0)
        self._arrivals = [a for a in self._arrivals if a[2].offset() >= start]
        heapq.heapify(self._arrivals)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        pass

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self._position) for tp in partitions]

    def consumer_group_metadata(self) -> object:
        return GROUP_METADATA

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None:
        self.committed_offsets.append((self.clock.now, offsets))

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return -1, -1
