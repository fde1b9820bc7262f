"""Reading a partition "to its end" correctly: the one piece every restore, drain and check relies on.

The end is the high watermark (a read_uncommitted ListOffsets), captured once. A read_committed consumer is done
with a partition when its *position* reaches that end. Offsets are not data: commit/abort markers and aborted
records occupy offsets too, so `end - 1` is often a marker and the last data record may sit well below it, and
one poll may return nothing while the fetcher skips such a tail. Hence: never seek-to-end-then-poll, never
trust a single empty poll, always loop against a deadline, and say which partitions were stuck if it expires
(an open transaction holds the last stable offset below the high watermark until it ends).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.kafka.records import Consumed
from pipeline.retry import Backoff, retry

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)


class EndOffsetsTimeout(TimeoutError):
    pass


class OffsetsNotKnown(LookupError):
    """ListOffsets answered, with a negative offset for a partition: not known yet."""


def known(topic: str, offsets: dict[int, int]) -> dict[int, int]:
    """`offsets` as ListOffsets answered them, if every one is a real offset. While a broker of the 3-node cluster
    restarted, one answer came back below zero: the snapshot scan then started at offset -8, its assign() failed
    (_INVALID_ARG) and the process exited, found by the fault tests' exit check."""
    unknown = {p: offset for p, offset in offsets.items() if offset < 0}
    if unknown:
        raise OffsetsNotKnown(f"{topic}: ListOffsets answered {unknown}")
    return offsets


class OffsetsTruncated(RuntimeError):
    """Records were deleted under a reader (delete_records by the compaction job): start over."""


class ReadToEndTimeout(TimeoutError):
    def __init__(self, topic: str, stuck: Mapping[int, tuple[int, int]]) -> None:
        detail = ", ".join(f"p{p}: position {pos} < end {end}" for p, (pos, end) in sorted(stuck.items()))
        super().__init__(
            f"{topic}: did not reach the end in time ({detail}). An open transaction keeps the last stable "
            "offset below the high watermark until it commits, aborts or times out."
        )
        self.topic = topic
        self.stuck = dict(stuck)


def watermarks(
    admin: AdminClient, topic: str, partitions: list[int], timeout_s: float, spec: OffsetSpec | None = None
) -> dict[int, int]:
    """Offsets per partition by ListOffsets (default: the high watermark). Retriable errors (a leader being
    elected, a just-created topic) are retried until timeout_s; then EndOffsetsTimeout says why."""
    request = {TopicPartition(topic, p): spec or OffsetSpec.latest() for p in partitions}
    deadline = time.monotonic() + timeout_s

    def ask() -> dict[int, int]:
        remaining = max(0.1, deadline - time.monotonic())
        futures = admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=remaining
        )
        return known(topic, {tp.partition: f.result(timeout=remaining).offset for tp, f in futures.items()})

    def on_failure(error: Exception, failures: int, delay: float | None) -> None:
        if delay is not None and isinstance(error, KafkaException) and error.args[0].code() in _LEADERSHIP_CHANGES:
            refresh_leaders(admin, [topic], max(0.1, deadline - time.monotonic()))

    def transient(e: Exception) -> bool:
        return isinstance(e, OffsetsNotKnown) or (isinstance(e, KafkaException) and _transient(e.args[0]))

    try:
        return retry(ask, retriable=transient, backoff=Backoff(0.1, 1.0), within_s=timeout_s, on_failure=on_failure)
    except (KafkaException, OffsetsNotKnown) as e:
        raise EndOffsetsTimeout(f"{topic}: end offsets not known within {timeout_s:.0f}s ({e.args[0]})") from e
    except TimeoutError as e:
        raise EndOffsetsTimeout(f"{topic}: end offsets not known within {timeout_s:.0f}s") from e


# Metadata that is stale while leaders move (a broker restarting): librdkafka does not flag all of them retriable.
_LEADERSHIP_CHANGES = {
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def stable_end_offsets(admin: AdminClient, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    """The last stable offset per partition (ListOffsets with read_committed), with a bounded wait."""
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    try:
        futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s)
        return known(topic, {tp.partition: f.result(timeout=timeout_s).offset for tp, f in futures.items()})
    except (KafkaException, TimeoutError, OffsetsNotKnown) as e:
        raise EndOffsetsTimeout(f"{topic}: end offsets not known within {timeout_s:.0f}s ({e})") from e


# A new leader whose high watermark has not caught up yet (KIP-207): Java's clients retry it; librdkafka 2.16 does not
# flag it retriable. A broker-fault run's final check failed on it a few seconds after a paused leader came back.
_NOT_YET = {KafkaError.OFFSET_NOT_AVAILABLE}


def seek_all(consumer: Consumer, partition: int, offsets: Mapping[str, int | None]) -> bool:
    """Partition `partition` of every topic in `offsets` to its offset (None: the beginning); False when a seek did not
    take (p not assigned yet, say): the caller tries again on a later turn."""
    try:
        for topic, offset in offsets.items():
            consumer.seek(TopicPartition(topic, partition, OFFSET_BEGINNING if offset is None else offset))
    except KafkaException:
        return False
    return True


def _transient(error: KafkaError) -> bool:
    return error.retriable() or error.code() in _LEADERSHIP_CHANGES | _NOT_YET


def refresh_leaders(admin: AdminClient, topics: Iterable[str], timeout_s: float) -> None:
    """One metadata request per topic, best effort. The admin client keeps the partition leaders it knew: after a
    broker restart every ListOffsets to them fails (FENCED_LEADER_EPOCH, NOT_LEADER_FOR_PARTITION) until then."""
    for topic in topics:
        with contextlib.suppress(KafkaException):
            admin.list_topics(topic, timeout=timeout_s)


def relearn_leaders(admin: AdminClient, topics: Iterable[str], timeout_s: float) -> None:
    """refresh_leaders without waiting, for the poll loop's thread: one Metadata request (DescribeTopics) whose answer
    librdkafka parses into the client's metadata cache, as it does every Metadata answer.

    Why an admin client repeats FENCED_LEADER_EPOCH: its ListOffsets takes each partition's leader and leader epoch
    from that cache and sends the epoch along. After a broker restart the epoch moved on, and the broker answers
    FENCED_LEADER_EPOCH (or UNKNOWN_LEADER_EPOCH). librdkafka 2.16 drops a topic's cache entry after
    NOT_LEADER_OR_FOLLOWER and LEADER_NOT_AVAILABLE only (rd_kafka_ListOffsets_handle_result), and an admin client
    refreshes the metadata of no topic by itself (it has no topic handles), so the stale epoch stayed until the entry
    aged out (metadata.max.age.ms, 15 minutes by default): every ask in between failed the same way."""
    wanted = sorted(set(topics))
    if not wanted:
        return
    try:
        admin.describe_topics(TopicCollection(wanted), request_timeout=timeout_s)  # the answer updates the cache
    except KafkaException as e:  # best effort: the next failed ask tries again
        log.debug("metadata of %s not asked for: %s", wanted, e)


def leaders_moved(error: BaseException | None) -> bool:
    """An answer that says the client's partition leaders are out of date."""
    return isinstance(error, KafkaException) and error.args[0].code() in _LEADERSHIP_CHANGES


class OffsetRequest(NamedTuple):
    """One offset to ask ListOffsets for."""

    tp: TopicPartition
    spec: OffsetSpec
    level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED


def ask_offsets(
    admin: AdminClient, wanted: Mapping[K, OffsetRequest], timeout_s: float
) -> Callable[[], dict[K, Future[Any]]]:
    """A function that sends ListOffsets for `wanted` and returns its futures by the same keys, without waiting. One
    request holds one isolation level and each partition once: the earliest and the latest offset of one partition
    go in two requests."""

    def ask() -> dict[K, Future[Any]]:
        batches: list[tuple[IsolationLevel, dict[TopicPartition, tuple[K, OffsetSpec]]]] = []
        for key, (tp, spec, level) in wanted.items():
            batch = next((b for lvl, b in batches if lvl == level and tp not in b), None)
            if batch is None:
                batches.append((level, batch := {}))
            batch[tp] = (key, spec)
        futures: dict[K, Future[Any]] = {}
        for level, batch in batches:
            request = {tp: spec for tp, (_, spec) in batch.items()}
            answered = admin.list_offsets(request, isolation_level=level, request_timeout=timeout_s)
            futures.update({batch[tp][0]: future for tp, future in answered.items()})
        return futures

    return ask


ASK_AGAIN_AFTER_S = 1.0  # a broker that refused or failed the last ask is not asked again sooner


class PendingOffsets(Generic[K]):
    """Offsets asked of the broker without waiting: the poll loop's thread looks at `result()` each turn, and never
    waits for a broker (docs/guarantees.md: restore-keeps-membership). An ask that failed, got a negative offset
    (not known yet: `known`) or no answer within REQUEST_TIMEOUT_MS is asked again, at most once a second, after
    the partitions' leaders were asked for again (`relearn_leaders`). The first failure is a WARNING, the answer
    after failures an INFO. After `give_up_s` (None: never; the caller's own deadline decides) EndOffsetsTimeout
    names the last failure. A restore's set-up (pipeline/state/restore_setup.py, table_restore.py) and a take-over's
    global-table targets (pipeline/state/global_tables.py) wait so."""

    def __init__(
        self,
        what: str,
        ask: Callable[[], Mapping[K, Future[Any]]],
        refresh: Callable[[], object],
        request_timeout_s: float,
        give_up_s: float | None = None,
    ) -> None:
        self.what, self._ask, self._refresh, self._request_timeout_s = what, ask, refresh, request_timeout_s
        self._started = time.monotonic()
        self._give_up_at = None if give_up_s is None else self._started + give_up_s
        self.failures = 0
        self.last_failure: str | None = None
        self._offsets: dict[K, int] | None = None
        self._futures: Mapping[K, Future[Any]] | None = None  # None: the last ask was refused before it was sent
        self._asked_at, self._refreshed = self._started, False
        self._send()

    def result(self) -> dict[K, int] | None:
        """The offsets once the broker answered them all; None until then."""
        if self._offsets is not None:
            return self._offsets
        if self._futures is None:
            self._failed(self.last_failure or "not asked", False)
        elif all(f.done() for f in self._futures.values()):
            try:
                self._offsets = self._answered(self._futures)
                if self.failures:
                    log.info("%s: answered after %d failed asks", self.what, self.failures)
            except (KafkaException, OffsetsNotKnown) as e:
                self._failed(str(e.args[0]), any(leaders_moved(f.exception()) for f in self._futures.values()))
        elif time.monotonic() - self._asked_at > self._request_timeout_s:
            self._failed("no answer within REQUEST_TIMEOUT_MS", False)
        return self._offsets

    def stuck(self) -> str:
        """What the ask waits for, for a stall WARNING or a time-out."""
        waited = time.monotonic() - self._started
        if self.last_failure is None:
            return f"{self.what}: asked {waited:.0f} s ago, no answer yet"
        failed = f"{self.failures} failed asks (last: {self.last_failure})"
        return f"{self.what}: not known after {waited:.0f} s and {failed}"

    def _answered(self, futures: Mapping[K, Future[Any]]) -> dict[K, int]:
        offsets = {key: future.result().offset for key, future in futures.items()}
        unknown = {key: offset for key, offset in offsets.items() if offset < 0}
        if unknown:  # a negative offset is no offset: ask again (see `known`)
            raise OffsetsNotKnown(f"ListOffsets answered {unknown}")
        return offsets

    def _send(self) -> None:
        self._asked_at, self._refreshed = time.monotonic(), False
        try:
            self._futures = self._ask()
        except KafkaException as e:  # refused locally (the client's queue): looked at again next turn
            self._futures = None
            self.last_failure = str(e.args[0])

    def _failed(self, why: str, leaders: bool) -> None:
        self.last_failure = why
        if self._give_up_at is not None and time.monotonic() > self._give_up_at:
            raise EndOffsetsTimeout(f"{self.what}: not known within RESTORE_TIMEOUT_MS ({why})")
        if not self._refreshed:  # stale leaders fail every ask until the metadata is refreshed (relearn_leaders)
            self._refreshed = True  # now, so that the answer is in before the ask goes again: asked at the same
            self._refresh()  # time, the ask still took the stale leader (seen on the 3-node cluster)
        if time.monotonic() - self._asked_at < ASK_AGAIN_AFTER_S:
            return  # the failed futures stay: looked at again next turn
        self.failures += 1
        (log.warning if self.failures == 1 else log.debug)(  # said once; an INFO once answered
            "%s: not known yet (%s)%s; asking again until answered",
            self.what,
            why,
            ": partition leaders moved, their metadata asked for again" if leaders else "",
        )
        self._send()


def high_watermarks(admin: AdminClient, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    return watermarks(admin, topic, partitions, timeout_s, OffsetSpec.latest())


def low_watermarks(admin: AdminClient, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    return watermarks(admin, topic, partitions, timeout_s, OffsetSpec.earliest())


class Reading(Protocol):
    """What a TailReader needs of its consumer: a Consumer, or a CheckedConsumer around one."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...


class CheckedConsumer:
    """A consumer whose `consume` raises OffsetsTruncated instead of silently jumping when records it was about to
    read were deleted. Needs auto.offset.reset=error in the consumer's configuration."""

    _TRUNCATED = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        messages = self._consumer.consume(num_messages=num_messages, timeout=timeout)
        for m in messages:
            if (error := m.error()) is not None and error.code() in self._TRUNCATED:
                raise OffsetsTruncated(f"{m.topic()}[{m.partition()}]: {error}")
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class TailReader:
    """Reads partitions of one topic from given offsets up to given end offsets, in steps.

    `step()` never blocks longer than its timeout, so a caller can interleave it with `poll()` on another consumer
    (restore must not cost the group membership). The consumer should use isolation.level=read_committed and be
    dedicated to this reader (it is assigned exactly the partitions still to read).
    """

    def __init__(self, consumer: Reading, topic: str, starts: Mapping[int, int], ends: Mapping[int, int]) -> None:
        self.consumer = consumer
        self.topic = topic
        self.ends = dict(ends)
        self.positions = {p: starts[p] for p in ends}
        self._remaining = {p for p in ends if starts[p] < ends[p]}
        self.consumer.assign([TopicPartition(topic, p, self.positions[p]) for p in sorted(self._remaining)])

    @property
    def done(self) -> bool:
        return not self._remaining

    def step(self, timeout_s: float = 0.1, max_records: int = 10_000) -> list[Consumed]:
        """Up to max_records data records; empty when nothing arrived in time or everything is read."""
        if self.done:
            return []
        messages = self.consumer.consume(num_messages=max_records, timeout=timeout_s)
        if len(self.ends) == 1 and messages and not any(map(Message.error, messages)):
            records = self._in_range(cast(list[Consumed], messages))  # one partition (a restore): no per-record Python
        else:
            records = self._filter(messages)
        self._mark_finished()
        return records

    def _in_range(self, messages: list[Consumed]) -> list[Consumed]:
        (p,) = self._remaining
        end = self.ends[p]
        if messages[-1].offset() >= end:  # written after the end was captured: not part of this read
            messages = [m for m in messages if m.offset() < end]
        if messages:
            self.positions[p] = messages[-1].offset() + 1
        return messages

    def _filter(self, messages: list[Message]) -> list[Consumed]:
        records = []
        for message in messages:
            if (error := message.error()) is not None:
                if error.fatal():
                    raise KafkaException(error)
                continue
            m = cast(Consumed, message)  # no error: a record, with its partition and offset
            p = m.partition()
            if p not in self._remaining or m.offset() >= self.ends[p]:
                continue  # written after the end was captured: not part of this read
            records.append(m)
            self.positions[p] = m.offset() + 1
        return records

    def stuck(self) -> dict[int, tuple[int, int]]:
        return {p: (self.positions[p], self.ends[p]) for p in self._remaining}

    def _mark_finished(self) -> None:
        # The position moves past markers and aborted records that never reach the application; never past the end:
        # records written after it were fetched in the same batch and dropped, and a reader that goes on from
        # `positions` (a global or co-partitioned table) must read them again. Taking the consumer's position
        # uncapped skipped them for good: a global table kept an account's older value (an order_fills fault run).
        for tp in self.consumer.position([TopicPartition(self.topic, p) for p in self._remaining]):
            if tp.offset >= 0:
                p = tp.partition
                self.positions[p] = max(self.positions[p], min(tp.offset, self.ends[p]))
        finished = {p for p in self._remaining if self.positions[p] >= self.ends[p]}
        if finished:
            self._remaining -= finished
            self.consumer.incremental_unassign([TopicPartition(self.topic, p) for p in finished])


def read_to_end(reader: TailReader, timeout_s: float) -> Iterator[Consumed]:
    """All records of a TailReader, or ReadToEndTimeout naming the partitions that did not reach their end."""
    deadline = time.monotonic() + timeout_s
    while not reader.done:
        if time.monotonic() > deadline:
            raise ReadToEndTimeout(reader.topic, reader.stuck())
        yield from reader.step()
