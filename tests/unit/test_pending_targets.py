"""A take-over's global-table targets are asked for without waiting (pipeline/state/global_tables.py:
PendingTargets): the poll loop looks at the answer each turn, asks again when the broker failed or did not answer,
and gives up loudly after RESTORE_TIMEOUT_MS."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.kafka.offsets import EndOffsetsTimeout
from pipeline.state import global_tables
from pipeline.state.global_tables import PendingTargets

TPS = [TopicPartition("accounts", 0), TopicPartition("accounts", 1)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """Stands in for AdminClient.list_offsets: every ask gets fresh futures, answered by the test."""

    def __init__(self) -> None:
        self.asks: list[dict[TopicPartition, Future[Any]]] = []
        self.refreshes = 0

    def refresh(self) -> None:
        self.refreshes += 1

    def ask(self) -> dict[TopicPartition, Future[Any]]:
        self.asks.append({tp: Future() for tp in TPS})
        return self.asks[-1]

    def answer(self, offsets: list[int]) -> None:
        for future, offset in zip(self.asks[-1].values(), offsets, strict=True):
            future.set_result(SimpleNamespace(offset=offset))

    def fail(self) -> None:
        for future in self.asks[-1].values():
            future.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down")))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(global_tables.time, "monotonic", clock)
    return clock


def test_the_targets_come_when_the_broker_answers_and_the_loop_never_waits(clock: Clock) -> None:
    broker = Broker()
    pending = PendingTargets(broker.ask, broker.refresh, request_timeout_s=10, give_up_s=600)
    assert pending.result() is None  # not answered yet: the loop goes on
    broker.answer([7, 9])
    assert pending.result() == {"accounts": {0: 7, 1: 9}}
    assert len(broker.asks) == 1


def test_a_failed_ask_is_asked_again_after_a_second(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker()
    pending = PendingTargets(broker.ask, broker.refresh, request_timeout_s=10, give_up_s=600)
    broker.fail()
    assert pending.result() is None and len(broker.asks) == 1  # not sooner than ASK_AGAIN_AFTER_S
    clock.now += 1.5
    with caplog.at_level(logging.INFO, logger=global_tables.__name__):
        assert pending.result() is None
    assert len(broker.asks) == 2
    assert broker.refreshes == 1, "stale leaders (FENCED_LEADER_EPOCH) fail every ask until the metadata is refreshed"
    assert "asking again" in caplog.text and "broker down" in caplog.text
    broker.answer([3, 4])
    assert pending.result() == {"accounts": {0: 3, 1: 4}}


def test_an_ask_without_an_answer_is_asked_again_after_the_request_timeout(clock: Clock) -> None:
    broker = Broker()
    pending = PendingTargets(broker.ask, broker.refresh, request_timeout_s=10, give_up_s=600)
    clock.now += 5
    assert pending.result() is None and len(broker.asks) == 1
    clock.now += 6
    assert pending.result() is None and len(broker.asks) == 2


def test_after_the_restore_timeout_the_take_over_fails_loudly(clock: Clock) -> None:
    broker = Broker()
    pending = PendingTargets(broker.ask, broker.refresh, request_timeout_s=10, give_up_s=30)
    broker.fail()
    clock.now += 31
    with pytest.raises(EndOffsetsTimeout, match=r"RESTORE_TIMEOUT_MS.*broker down"):
        pending.result()


def test_a_negative_end_is_not_a_target_it_is_asked_again(clock: Clock) -> None:
    # -1 read as a target is reached at once: the tasks would start before the tables were read.
    broker = Broker()
    pending = PendingTargets(broker.ask, broker.refresh, request_timeout_s=10, give_up_s=600)
    broker.answer([7, -1])
    assert pending.result() is None
    clock.now += 1.5
    assert pending.result() is None and len(broker.asks) == 2
    broker.answer([7, 9])
    assert pending.result() == {"accounts": {0: 7, 1: 9}}
