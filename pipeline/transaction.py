"""One producer's transaction and the partitions writing into it, committed or aborted together.

PRODUCERS=per_partition: each input partition has its own transactional producer, named after the partition, so each
has its own Transaction with one participant, and a new owner fences the previous one by initialising that name.
PRODUCERS=per_process (KIP-447): one transactional producer for the whole process. Every partition that processed
something since the last commit is a participant; they commit together, and abort together. A zombie is fenced by
the group instead of by the name: its consumed offsets carry a stale generation, the broker refuses them, and the
transaction can only abort (docs/guarantees.md: zombies-stay-out).

    fence()       init_transactions, once per producer (docs/guarantees.md: fence-first)
    join(task)    begins the transaction if none is open; the task becomes a participant
    commit()      1. every participant writes its state changes and checkpoint to its changelog partition
                  2. every participant's next offset goes into the transaction, with the group's metadata
                  3. commit_transaction (docs/guarantees.md: one-transaction)
                  4. every participant moves its committed offset and state forward
    abort()       abort_transaction; every participant undoes its state and rewinds (docs/guarantees.md:
                  rewind-after-abort)

A Kafka error inside a transaction is classified (pipeline/errors.py): an unknown outcome is retried, an abortable
error raises TransactionAborted, a fenced or fatal producer raises ProducerBroken (docs/guarantees.md:
unknown-commit-retried).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline.errors import Action, classify, kafka_error
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def transactional_id(app_id: str, topic: str, partition: int) -> str:
    """PRODUCERS=per_partition: stable across restarts and hosts, so that the next owner of the partition fences the
    previous one."""
    return f"{app_id}.{topic}.{partition}"


class TransactionAborted(Exception):
    """The open transaction must be (or was) aborted; state and position go back to the last commit."""


class PartitionDropped(Exception):
    """The producer can never commit again (fenced, fatal, or an outcome that stayed unknown)."""


class Participant(Protocol):
    """What a transaction needs of a partition writing into it (pipeline/task.py's PartitionTask)."""

    partition: int

    def prepare_commit(self) -> TopicPartition: ...

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
    ) -> None:
        self.producer = producer
        self.name = name  # for log lines: "p3" or the process's transactional.id
        self.participants: list[Participant] = []
        self.broken = False  # fenced or fatal: this producer never commits again
        self._transactional = settings.exactly_once
        self._timeout_s = settings.request_timeout_ms / 1000
        self._retry_for_s = settings.transaction_timeout_ms / 1000
        self._fenced = False
        self._count = 0
        # Test hook: called before each commit; returning True aborts that transaction instead (injected aborts).
        self._abort_hook = abort_hook
        self._observe_commit = observe_commit  # seconds per commit, once per transaction (however many partitions)

    @property
    def open(self) -> bool:
        return bool(self.participants)

    # -- fence (docs/guarantees.md: fence-first) -----------------------------------------------------------------------
    def fence(self) -> None:
        if self._transactional and not self._fenced:
            self.producer.init_transactions(self._timeout_s)
            self._fenced = True

    # -- begin ---------------------------------------------------------------------------------------------------------
    def join(self, task: Participant) -> None:
        if not self.participants and self._transactional:
            self.call(self.producer.begin_transaction)
        self.participants.append(task)

    def leave(self, task: Participant) -> None:
        """A participant dropped without committing (the others stay in the transaction)."""
        if task in self.participants:
            self.participants.remove(task)

    # -- commit (docs/guarantees.md: one-transaction) ------------------------------------------------------------------
    def commit(self, consumer: Consumer) -> None:
        if not self.participants:
            return
        started = time.monotonic()
        offsets = [task.prepare_commit() for task in self.participants]  # 1
        self._count += 1
        if self._abort_hook is not None and self._abort_hook(self._count):
            raise TransactionAborted("injected abort (test hook)")
        if self._transactional:
            group = consumer.consumer_group_metadata()  # now: the generation that owns these partitions
            self.call(self.producer.send_offsets_to_transaction, offsets, group, self._timeout_s)  # 2
            self.call(self.producer.commit_transaction, self._timeout_s)  # 3
        else:  # at_least_once: outputs first, offsets after
            self.call(self.producer.flush, self._timeout_s)
            consumer.commit(offsets=offsets, asynchronous=False)
        if self._observe_commit is not None:
            self._observe_commit(time.monotonic() - started)
        committed, self.participants = self.participants, []
        for task in committed:
            task.committed()  # 4

    # -- abort (docs/guarantees.md: rewind-after-abort) ----------------------------------------------------------------
    def abort(self) -> None:
        """Aborts what is open; every participant rewinds."""
        rewound, self.participants = self.participants, []
        if rewound and self._transactional:
            self.call(self.producer.abort_transaction, self._timeout_s)
        for task in rewound:
            task.rewind()

    def abort_on_close(self, closing: Participant) -> None:
        """`closing` ends its ownership with work open: abort it once (no retries: whatever is left open is aborted by
        the broker's transaction time-out or by the next owner), and the other participants rewind."""
        others, self.participants = [t for t in self.participants if t is not closing], []
        if self._transactional and not self.broken:
            try:
                self.producer.abort_transaction(self._timeout_s)
                log.info("%s: open transaction aborted (p%d closed)", self.name, closing.partition)
            except KafkaException as e:
                log.info("%s: open transaction not aborted here (%s): fenced or timed out", self.name, e)
        for task in others:
            task.rewind()

    # -- calls ---------------------------------------------------------------------------------------------------------
    def call(self, method: Callable, *args) -> None:
        """Calls a transactional producer method, retrying while its outcome is unknown
        (docs/guarantees.md: unknown-commit-retried)."""
        deadline = time.monotonic() + self._retry_for_s
        while True:
            try:
                method(*args)
                return
            except KafkaException as e:
                error = kafka_error(e)
                if error is not None and classify(error) is Action.RETRY and time.monotonic() < deadline:
                    log.info("%s: %s: %s; retrying", self.name, method.__name__, error)
                    time.sleep(0.05)
                    continue
                self.raise_classified(method.__name__, e)

    def raise_classified(self, operation: str, exc: KafkaException) -> None:
        """A Kafka error inside a transaction becomes TransactionAborted or PartitionDropped (never RETRY here)."""
        error = kafka_error(exc)
        if error is not None and classify(error) is Action.ABORT:
            raise TransactionAborted(f"{operation}: {error}") from exc
        self.broken = True
        raise PartitionDropped(f"{operation}: {error or exc}") from exc
