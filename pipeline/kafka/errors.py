"""What to do about a Kafka error raised inside a transaction (docs/guarantees.md: unknown-commit-retried)."""

from __future__ import annotations

import enum

from confluent_kafka import KafkaError, KafkaException

_FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


class Action(enum.Enum):
    RETRY = "retry"  # the outcome is unknown: call the same method again, it resumes
    ABORT = "abort"  # abort the transaction, then rewind state and position to the last commit
    DROP = "drop"  # the producer can never commit again: drop the partition without committing


def classify(error: KafkaError) -> Action:
    if error.fatal() or error.code() in _FENCED_CODES:
        return Action.DROP
    if error.txn_requires_abort():
        return Action.ABORT
    if error.retriable():
        return Action.RETRY
    # Neither abortable nor retriable: the producer's state is unknown, so never guess that it committed.
    return Action.DROP


def kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_fenced(error: KafkaError) -> bool:
    return error.code() in _FENCED_CODES
