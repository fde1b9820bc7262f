"""A restore's set-up asks the broker without waiting (pipeline/state/restore.py: phase OFFSETS, PendingOffsets):
a step whose answer has not come returns at once, the other partitions' restores and the poll loop go on, and the
answer is taken at a later step. Real ChangelogRestore, TableRestore and RestoreManager; the broker is a fake whose
futures a test answers, and whose `result()` refuses to wait: a step that waits on the broker fails the test (the
synchronous set-up did, up to REQUEST_TIMEOUT_MS per ask on the poll loop's thread)."""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Message, TopicPartition

from pipeline.app import Table
from pipeline.core.stall import BrokerEnds
from pipeline.kafka.offsets import PendingOffsets
from pipeline.serde import JSON
from pipeline.settings import Settings
from pipeline.state.restore import RestoreError, RestorePhase
from pipeline.state.restore_manager import RestoreManager
from tests.fakes import FakeClock, kafka_message

CHANGELOG, SNAPSHOTS, TABLE = "app-changelog", "app-snapshots", "accounts"


class NoWaitFuture(Future):  # type: ignore[type-arg]
    """A broker's answer that a caller may take once it is there, never wait for."""

    def result(self, timeout: float | None = None) -> Any:
        assert self.done(), "the poll loop's thread waited on the broker for an answer not there yet"
        return super().result(0)


class Broker:
    """The records of every partition, and the admin client that asks about them. ListOffsets of a reachable
    partition is answered at once; of another, it stays open until `answer_pending()`."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.logs: dict[tuple[str, int], list[Message]] = {}
        self.unreachable: set[int] = set()  # partitions whose leader does not answer
        self.wrong: dict[int, int | KafkaError] = {}  # partition -> its next answer instead of the real one
        self.pending: list[tuple[TopicPartition, Any, NoWaitFuture]] = []
        self.asks: list[tuple[list[tuple[str, int]], IsolationLevel]] = []
        self.described: list[list[str]] = []  # metadata asked for (relearn_leaders)

    def write(self, topic: str, p: int, n: int) -> None:
        log = self.logs.setdefault((topic, p), [])
        for i in range(n):
            log.append(kafka_message(len(log), f"k{i}".encode(), b'{"n": %d}' % i, partition=p, topic=topic))

    # -- the admin client --------------------------------------------------------------------------------------------
    def list_offsets(self, request: dict[TopicPartition, Any], isolation_level: Any, **_: Any) -> dict[Any, Future]:  # type: ignore[type-arg]
        self.asks.append((sorted((tp.topic, tp.partition) for tp in request), isolation_level))
        futures = {}
        for tp, spec in request.items():
            futures[tp] = future = NoWaitFuture()
            if tp.partition in self.unreachable:
                self.pending.append((tp, spec, future))
            else:
                self._answer(tp, spec, future)
        return futures

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future]:  # type: ignore[type-arg]
        self.described.append(list(topics.topic_names))
        return {}

    def answer_pending(self) -> None:
        self.unreachable.clear()
        for tp, spec, future in self.pending:
            self._answer(tp, spec, future)
        self.pending = []

    def _answer(self, tp: TopicPartition, spec: Any, future: Future) -> None:  # type: ignore[type-arg]
        wrong = self.wrong.pop(tp.partition, None)
        if isinstance(wrong, KafkaError):
            future.set_exception(KafkaException(wrong))
            return
        latest = spec._value == -1  # OffsetSpec.latest()
        offset = len(self.logs.get((tp.topic, tp.partition), [])) if latest else 0
        future.set_result(types.SimpleNamespace(offset=offset if wrong is None else wrong))

    # -- a read_committed consumer -----------------------------------------------------------------------------------
    def consumer(self) -> LogConsumer:
        return LogConsumer(self)


class LogConsumer:
    """Reads the broker's logs from where it is assigned; a consume with nothing to hand out waits its timeout."""

    def __init__(self, broker: Broker) -> None:
        self.broker, self.positions, self.closed = broker, {}, False

    def list_topics(self, topic: str, timeout: float) -> None:
        pass

    def assign(self, tps: list[TopicPartition]) -> None:
        self.positions = {(tp.topic, tp.partition): tp.offset for tp in tps}

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions.pop((tp.topic, tp.partition), None)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out: list[Message] = []
        for (topic, p), at in self.positions.items():
            records = self.broker.logs.get((topic, p), [])[at : at + num_messages - len(out)]
            self.positions[(topic, p)] = at + len(records)
            out += records
        if not out:
            self.broker.clock.now += max(0.0, timeout)
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions[(tp.topic, tp.partition)]) for tp in tps]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    clock = FakeClock()
    monkeypatch.setattr("time.monotonic", clock)  # the restore's deadline, the asks' time-outs, the step budgets
    broker = Broker(clock)
    for p, n in ((0, 30), (1, 40)):
        broker.write(CHANGELOG, p, n)
    yield broker


def manager(broker: Broker, tables: dict[str, Table] | None = None, timeout_ms: int = 60_000) -> RestoreManager:
    return RestoreManager(
        Settings(restore_timeout_ms=timeout_ms, request_timeout_ms=10_000, restore_step_ms=200),
        CHANGELOG,
        SNAPSHOTS,
        JSON,
        broker.consumer,  # type: ignore[arg-type]
        lambda: broker,  # type: ignore[arg-type,return-value]
        broker,  # type: ignore[arg-type]
        tables,
    )


def turn(restores: RestoreManager, broker: Broker) -> list[int]:
    """One turn of the poll loop: a poll (100 ms here), then the restores' step. The partitions that finished."""
    broker.clock.now += 0.1
    return [r.partition for r in restores.step()]


def test_an_unanswered_ask_does_not_hold_the_step_the_other_partition_restores_and_the_answer_comes_later(
    broker: Broker,
) -> None:
    broker.unreachable = {0}  # p0's leader has gone: its ListOffsets is not answered
    restores = manager(broker)
    restores.start(0, None)
    restores.start(1, None)
    finished = []
    for _ in range(5):  # each turn returns: no step waited on p0's open asks (NoWaitFuture)
        finished += turn(restores, broker)
    assert finished == [1], "p1 restores while p0's broker does not answer"
    assert restores.running()[0].phase is RestorePhase.OFFSETS
    assert "offsets of app-changelog and app-snapshots: asked 1 s ago, no answer yet" in restores.stuck(0)

    broker.answer_pending()
    finished = turn(restores, broker)
    assert finished == [0], "the answer is taken at the next step"
    assert not restores.busy


def test_the_changelog_is_read_from_the_answered_bounds(broker: Broker) -> None:
    restores = manager(broker)
    broker.unreachable = {1}
    restores.start(1, None)
    broker.write(CHANGELOG, 1, 5)  # written after the ask: beyond the end the restore reads to
    broker.answer_pending()
    [restore] = restores.step()
    assert restore.end == 45 and restore.records == 45 and len(restore.state) == 40  # keys k0..k39


def test_a_negative_answer_is_not_known_yet_and_is_asked_again_after_the_leaders(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.wrong[0] = -1
    restores = manager(broker)
    restores.start(0, None)
    assert turn(restores, broker) == [] and len(broker.asks) == 3  # earliest, latest, the snapshot topic's end
    broker.clock.now += 1.0
    with caplog.at_level(logging.WARNING):
        assert turn(restores, broker) == []  # asked again: p0 goes on on the next answer
    assert len(broker.asks) == 6 and broker.described == [[CHANGELOG, SNAPSHOTS]]
    assert "not known yet" in caplog.text and "answered {'changelog_low': -1}" in caplog.text
    assert turn(restores, broker) == [0]


def test_a_fenced_leader_epoch_makes_the_admin_relearn_the_leaders(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.wrong[0] = KafkaError(KafkaError.FENCED_LEADER_EPOCH)
    restores = manager(broker)
    restores.start(0, None)
    turn(restores, broker)
    broker.clock.now += 1.0
    with caplog.at_level(logging.WARNING):
        turn(restores, broker)
    assert broker.described == [[CHANGELOG, SNAPSHOTS]]
    assert "partition leaders moved" in caplog.text
    assert turn(restores, broker) == [0]


def test_the_restore_timeout_still_bounds_a_restore_whose_broker_never_answers(broker: Broker) -> None:
    broker.unreachable = {0}
    restores = manager(broker, timeout_ms=30_000)
    restores.start(0, None)
    with pytest.raises(RestoreError, match=r"restore of p0 timed out in phase offsets: .*no answer within REQUEST"):
        for _ in range(400):
            turn(restores, broker)
    assert len(broker.asks) > 3, "asked again after each REQUEST_TIMEOUT_MS without an answer"


def test_the_tables_bounds_are_asked_without_waiting_too(broker: Broker) -> None:
    broker.write(TABLE, 0, 7)
    restores = manager(broker, tables={"accounts": Table(TABLE)})
    restores.start(0, None)
    broker.unreachable = {0}  # from the tables' ask on: the changelog's is answered in start()
    finished = [p for _ in range(3) for p in turn(restores, broker)]
    assert finished == [] and "p0's tables: offsets of accounts: asked" in restores.stuck(0)
    broker.answer_pending()
    [restore] = restores.step()
    assert restore.tables is not None and restore.tables.positions == {TABLE: 7}


def test_broker_ends_relearn_the_leaders_and_say_so_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    ends = BrokerEnds(30, 10, clock)
    broker = Broker(clock)
    tp = TopicPartition("in", 0)
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    for _ in range(3):  # FENCED_LEADER_EPOCH every period: told once, the metadata asked for each time
        broker.wrong[0] = KafkaError(KafkaError.FENCED_LEADER_EPOCH)
        ends.ask(broker, [tp])  # type: ignore[arg-type]
        ends.collect()
        clock.now += 30
    assert broker.described == [["in"]] * 3
    assert caplog.text.count("no end offsets for in[0]") == 1 and "leaders moved" in caplog.text
    ends.ask(broker, [tp])  # type: ignore[arg-type]
    ends.collect()
    assert ends.ends == {("in", 0): 0}


def test_an_ask_of_nothing_is_answered_at_once_and_a_refused_one_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr("time.monotonic", clock)
    assert PendingOffsets("nothing", dict, lambda: None, 10).result() == {}
    refusals = [KafkaException(KafkaError(KafkaError._QUEUE_FULL))]

    def ask() -> dict[str, Future]:  # type: ignore[type-arg]
        if refusals:
            raise refusals.pop()
        future: Future = Future()  # type: ignore[type-arg]
        future.set_result(types.SimpleNamespace(offset=4))
        return {"end": future}

    pending = PendingOffsets("refused", ask, lambda: None, 10)
    assert pending.result() is None and "_QUEUE_FULL" in pending.stuck()
    clock.now += 1.5
    assert pending.result() is None  # asked again
    assert pending.result() == {"end": 4}
