"""One transactional producer and the tasks whose work is open in it. The runner builds every Transaction
(pipeline/sinks/kafka/runner.py: `KafkaRunner._transaction_for`) and commits or aborts it (`commit_transaction`,
`abort_transaction` in pipeline/sinks/kafka/commit.py); a task only stages its work in the one it was given.

PRODUCERS=per_partition: each input partition has its own producer, named after the partition (`transactional_id`),
so each task has a Transaction of its own, and a new owner fences the previous one by initialising that name.
PRODUCERS=per_process (KIP-447): one producer for the whole process (`process_transactional_id`). Every task that
processed something since the last commit is a participant; they commit together and abort together. A zombie is
fenced by the group instead of by the name: its consumed offsets carry a stale generation, the broker refuses them,
and the transaction can only abort (docs/guarantees.md: zombies-stay-out).

A Kafka error inside a transaction is classified (pipeline/kafka/errors.py): an unknown outcome is retried (`call`),
an abortable error raises TransactionAborted, a fenced or fatal producer raises PartitionDropped and the transaction
is `broken` for good (docs/guarantees.md: unknown-commit-retried).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from pipeline.kafka.bounded import CallHung, within
from pipeline.kafka.errors import Action, classify, kafka_error
from pipeline.retry import Backoff, retry
from pipeline.settings import Settings

log = logging.getLogger(__name__)
# While a transactional call's outcome is unknown (retriable), it is called again this often, for at most
# TRANSACTION_TIMEOUT_MS: beyond that the broker has aborted the transaction anyway.
UNKNOWN_OUTCOME_BACKOFF = Backoff(0.05, factor=1)
# What a producer call raises when it fails: librdkafka's error as a KafkaException, or the SystemError that
# confluent_kafka 2.16 raises instead when the error (a fenced or fatal producer, say) surfaced while a delivery
# callback ran and its exception was lost: "returned NULL without setting an exception" from a flush, seen in
# cluster fault runs, where it ended an instance with exit code 1 (raise_client_error finds the KafkaException when
# it is there).
PRODUCER_CALL_FAILED = (KafkaException, SystemError)


def transactional_id(app_id: str, topic: str, partition: int) -> str:
    """PRODUCERS=per_partition: stable across restarts and hosts, so that the next owner of the partition fences the
    previous one."""
    return f"{app_id}.{topic}.{partition}"


def process_transactional_id(app_id: str, topic: str, group_instance_id: str) -> str:
    """PRODUCERS=per_process: named after the static member when there is one, so that its next start aborts what its
    last left open at once; otherwise unique per start (two processes must never share it), and what a crashed
    process left open holds its partitions' next owners up to TRANSACTION_TIMEOUT_MS. Under the service's
    transactional-id prefix, like the per-partition names (pipeline/kafka/acls.py)."""
    return f"{app_id}.{topic}.process-{group_instance_id or uuid.uuid4().hex[:12]}"


class TransactionAborted(Exception):
    """The open transaction must be (or was) aborted; state and position go back to the last commit."""


class PartitionDropped(Exception):
    """The producer can never commit again (fenced, fatal, or an outcome that stayed unknown)."""


class Deliveries:
    """The delivery reports of one producer's messages since its transaction began: how many were not plainly
    acknowledged, and the first of them. Plainly acknowledged means with an offset in the partition. librdkafka also
    reports a message delivered, without an offset, when a later message of the same partition was acknowledged
    while this one's outcome was unknown: it assumes it was written ("implicitly acked"). After a partition leader
    died, the new leader may have lost that message and taken the later one as the producer's first; a commit then
    makes the transaction visible without it. The cluster fault run saw exactly this: a dead-letter topic's partition
    began with sequence 2 of the producer's epoch, the batch 0-1 (two dead letters) gone, the transaction committed
    (docs/guarantees.md: unknown-commit-retried). Such a transaction is aborted instead; its records are taken again."""

    def __init__(self) -> None:
        self.unconfirmed = 0
        self.first: str | None = None

    def report(self, error: Any, message: Any) -> None:
        """A delivery report (librdkafka's default callback of the producer, or a message's own)."""
        offset = message.offset()  # None for a negative offset (confluent_kafka's Message)
        if error is None and offset is not None and offset >= 0:
            return
        if not self.unconfirmed:
            what = str(error) if error is not None else "acknowledged without an offset (implicitly, not by the broker)"
            self.first = f"{message.topic()}[{message.partition()}]: {what}"
        self.unconfirmed += 1

    def clear(self) -> None:
        self.unconfirmed, self.first = 0, None


class Participant(Protocol):
    """What a transaction's commit and abort need of a task that staged work in it (KafkaTask)."""

    partition: int

    def prepare_commit(self) -> list[TopicPartition]: ...

    def committed(self) -> None: ...

    def rewind(self) -> None: ...


class Transaction:
    def __init__(
        self,
        producer: Producer,
        settings: Settings,
        name: str,
        abort_hook: Callable[[int], bool] | None = None,
        observe_commit: Callable[[float], None] | None = None,
        renew_with: Callable[[], Producer] | None = None,
        quick_fence: Callable[[], None] | None = None,
        deliveries: Deliveries | None = None,
    ) -> None:
        self.producer = producer
        # Fed by the producer's delivery reports (its on_delivery, given where it is made: KafkaRunner._new_transaction)
        self.deliveries = deliveries if deliveries is not None else Deliveries()
        self._renew_with = renew_with  # makes a producer under the same transactional.id (`renew`)
        self._quick_fence = quick_fence  # pipeline/kafka/kafka_python.py: before init_transactions, when given
        self.name = name  # for log lines: "p3" or the process's transactional.id
        self.participants: list[Participant] = []
        self.broken = False  # fenced or fatal: this producer never commits again
        self.transactional = settings.exactly_once
        self.timeout_s = settings.request_timeout_ms / 1000
        self._retry_for_s = settings.transaction_timeout_ms / 1000
        self._fenced = False
        self.commits = 0  # commits begun, the injected aborts count them
        # Test hook: called before each commit; returning True aborts that transaction instead (injected aborts).
        self.abort_hook = abort_hook
        self.observe_commit = observe_commit  # seconds per commit, once per transaction (however many partitions)

    @property
    def open(self) -> bool:
        return bool(self.participants)

    def fence(self, quick: bool = True) -> None:
        """init_transactions, once per producer (docs/guarantees.md: fence-first); the quick fence first unless
        `quick` is False (a take-over of many partitions at once: pipeline/sinks/kafka/takeover.py)."""
        if self.transactional and not self._fenced:
            if self._quick_fence is not None and quick:
                self._quick_fence()
            try:
                within(self.timeout_s, self.producer.init_transactions, self.timeout_s)
            except CallHung as e:  # the next attempt (takeover.fence retries it) on a producer that is not stuck
                log.error("%s: %s; asking again on a new producer", self.name, e)
                if self._renew_with is not None:
                    self.producer = self._renew_with()
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, str(e))) from e
            self._fenced = True

    def renew(self) -> None:
        """After an abort, before the next transaction: a new producer under the same transactional.id, initialised
        (docs/guarantees.md: renew-after-abort). librdkafka lacks KIP-890 (confluentinc/librdkafka#5423): the epoch
        stays the same from one transaction to the next, so a request of the aborted one still in flight (an offset
        commit retried while a coordinator moved) can land in the next and commit offsets whose changelog was
        aborted. A CI fault run found p2 committed at 6646 with a changelog that ended at 6499. init_transactions
        bumps the epoch, which fences every request of the old producer. PartitionDropped when it cannot be done."""
        if not self.transactional or self._renew_with is None:
            return
        started = time.monotonic()
        self.producer, self._fenced = self._renew_with(), False
        try:
            self.fence()
        except KafkaException as e:
            self.broken = True
            raise PartitionDropped(f"init_transactions after an abort: {kafka_error(e) or e}") from e
        log.info("%s: aborted; a new producer took over in %.0f ms", self.name, 1000 * (time.monotonic() - started))

    def join(self, task: Participant) -> None:
        """`task` stages work in this transaction from now on; the first one begins it."""
        if not self.participants:
            self.poll()  # reports of an aborted transaction's messages are served before the count starts
            self.deliveries.clear()
            if self.transactional:
                self.call(self.producer.begin_transaction)
        self.participants.append(task)

    def confirm_deliveries(self) -> None:
        """Before the commit: every message of the transaction delivered and acknowledged with an offset, or
        TransactionAborted (see Deliveries). Waits for the reports as commit_transaction would (its flush), at most
        TRANSACTION_TIMEOUT_MS: beyond that the broker aborts the transaction anyway."""
        deadline = time.monotonic() + self._retry_for_s
        try:
            remaining = self.producer.flush(self.timeout_s)
            while remaining and time.monotonic() < deadline:
                remaining = self.producer.flush(min(self.timeout_s, max(0.0, deadline - time.monotonic())))
        except PRODUCER_CALL_FAILED as e:  # a fenced or fatal producer fails its flush
            self.raise_client_error("flush", e)
        if remaining:
            raise TransactionAborted(f"{remaining} message(s) not delivered within TRANSACTION_TIMEOUT_MS")
        if self.deliveries.unconfirmed:
            raise TransactionAborted(
                f"{self.deliveries.unconfirmed} message(s) not confirmed by the broker, first {self.deliveries.first}"
            )

    def leave(self, task: Participant) -> None:
        """A participant dropped without committing (the others stay in the transaction)."""
        if task in self.participants:
            self.participants.remove(task)

    def end(self) -> list[Participant]:
        """The participants of the transaction that was just committed or aborted; none from now on."""
        ended, self.participants = self.participants, []
        return ended

    def call(self, method: Callable[..., Any], *args: Any) -> None:
        """Calls a transactional producer method, again while its outcome is unknown (docs/guarantees.md:
        unknown-commit-retried); any other error is classified (TransactionAborted or PartitionDropped)."""

        def unknown(error: Exception) -> bool:
            known = kafka_error(error)
            return known is not None and classify(known) is Action.RETRY

        def failed(error: Exception, failures: int, delay: float | None) -> None:
            if delay is not None:
                log.info("%s: %s: %s; retrying", self.name, method.__name__, kafka_error(error))

        try:
            retry(
                lambda: within(self.timeout_s, method, *args),
                retriable=unknown,
                backoff=UNKNOWN_OUTCOME_BACKOFF,
                within_s=self._retry_for_s,
                on_failure=failed,
                sleep=time.sleep,
            )
        except KafkaException as e:
            self.raise_classified(method.__name__, e)
        except CallHung as e:  # its outcome unknown, and the producer stuck: it never commits again
            log.error("%s: %s; its partitions are taken over again with a new producer", self.name, e)
            self.broken = True
            raise PartitionDropped(str(e)) from e

    def poll(self) -> None:
        """producer.poll(0): serves the delivery reports (Deliveries) of what was produced so far."""
        try:
            self.producer.poll(0)
        except PRODUCER_CALL_FAILED as e:
            self.raise_client_error("poll", e)

    def raise_client_error(self, operation: str, exc: Exception) -> NoReturn:
        """A producer call's error (PRODUCER_CALL_FAILED), classified: a SystemError by the KafkaException it was raised
        around, if any (a cluster fault run: "Deliveries.report returned a result with an exception set", caused by the
        fenced error). A SystemError around nothing ("returned NULL without setting an exception") is a producer whose
        error confluent_kafka lost: a CI broker fault run had it from a flush right after librdkafka logged the
        producer fenced, and the instance exited with code 1. Its state is unknown, so it never commits again: p is
        dropped (nothing of the open transaction commits; the next owner fences and restores)."""
        cause = exc if isinstance(exc, KafkaException) else exc.__cause__
        if isinstance(cause, KafkaException):
            self.raise_classified(operation, cause)
        if isinstance(exc, SystemError):
            self.broken = True
            raise PartitionDropped(f"{operation}: the producer failed and its error was lost ({exc})") from exc
        raise exc

    def raise_classified(self, operation: str, exc: KafkaException) -> NoReturn:
        """A Kafka error inside a transaction becomes TransactionAborted or PartitionDropped (never RETRY here)."""
        error = kafka_error(exc)
        if error is not None and classify(error) is Action.ABORT:
            raise TransactionAborted(f"{operation}: {error}") from exc
        self.broken = True
        raise PartitionDropped(f"{operation}: {error or exc}") from exc
