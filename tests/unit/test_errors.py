"""errors.classify (docs/guarantees.md: unknown-commit-retried): an unknown outcome is retried, an abortable error
aborts, anything else drops."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline.kafka.errors import Action, classify, is_fenced, kafka_error

FENCED = [KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH]
FLAGS = [
    {"fatal": f, "retriable": r, "txn_requires_abort": a}
    for f in (False, True)
    for r in (False, True)
    for a in (False, True)
]


def error(code: int = KafkaError._TIMED_OUT, *, fatal=False, retriable=False, txn_requires_abort=False) -> KafkaError:
    return KafkaError(code, "test", fatal=fatal, retriable=retriable, txn_requires_abort=txn_requires_abort)


def test_the_constructor_sets_the_flags_classify_reads() -> None:
    e = error(KafkaError._TIMED_OUT, fatal=True, retriable=True, txn_requires_abort=True)
    assert (e.code(), e.fatal(), e.retriable(), e.txn_requires_abort()) == (KafkaError._TIMED_OUT, True, True, True)
    e = error(KafkaError._TIMED_OUT)
    assert (e.fatal(), e.retriable(), e.txn_requires_abort()) == (False, False, False)


@pytest.mark.parametrize("flags", [f for f in FLAGS if f["fatal"]], ids=str)
def test_fatal_drops_whatever_else_is_flagged(flags: dict) -> None:
    assert classify(error(**flags)) is Action.DROP


@pytest.mark.parametrize("code", FENCED, ids=lambda c: KafkaError(c).name())
@pytest.mark.parametrize("flags", FLAGS, ids=str)
def test_fenced_codes_drop_even_if_flagged_retriable_or_abortable(code: int, flags: dict) -> None:
    e = error(code, **flags)
    assert classify(e) is Action.DROP
    assert is_fenced(e)


@pytest.mark.parametrize("retriable", [False, True])
def test_txn_requires_abort_aborts(retriable: bool) -> None:
    assert classify(error(KafkaError._STATE, retriable=retriable, txn_requires_abort=True)) is Action.ABORT


@pytest.mark.parametrize("code", [KafkaError._TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TRANSPORT])
def test_retriable_retries(code: int) -> None:
    e = error(code, retriable=True)
    assert classify(e) is Action.RETRY
    assert not is_fenced(e)


@pytest.mark.parametrize("code", [KafkaError._TIMED_OUT, KafkaError._STATE, KafkaError.UNKNOWN])
def test_neither_retriable_nor_abortable_drops(code: int) -> None:
    # the outcome is unknown: it is never treated as aborted (ABORT) or as committed (which RETRY could become)
    assert classify(error(code)) is Action.DROP


def test_kafka_error_unwraps_a_kafka_exception_only() -> None:
    e = error(KafkaError._TIMED_OUT, retriable=True)
    assert kafka_error(KafkaException(e)) is e
    assert kafka_error(KafkaException("not an error object")) is None
    assert kafka_error(KafkaException()) is None
    assert kafka_error(RuntimeError(e)) is None
