"""The Kafka sink's transaction protocol: how the runner commits a transaction (`commit_transaction`, in numbered
steps), aborts it (`abort_transaction`) and ends a partition's ownership (`close_task`). The runner
(pipeline/sinks/kafka/runner.py) decides when; these say how, in both producer modes."""

from __future__ import annotations

import contextlib
import logging
import time

from confluent_kafka import Consumer, KafkaException

from pipeline.core.lifecycle import Phase
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import PRODUCER_CALL_FAILED, PartitionDropped, Transaction, TransactionAborted

log = logging.getLogger(__name__)


# -- the transaction protocol (docs/guarantees.md: one-transaction, rewind-after-abort) --------------------------------
def commit_transaction(txn: Transaction, consumer: Consumer) -> None:
    """Commits everything staged in `txn` since it began, atomically: every participating task's outputs (produced
    as its records were processed), state changes and consumed offsets. The same in both producer modes: with
    PRODUCERS=per_partition `txn` carries one task, with per_process every task that processed something since the
    last commit. Raises TransactionAborted (then abort_transaction) or PartitionDropped (the producer is fenced or
    broken: drop its tasks, commit nothing)."""
    tasks = txn.participants
    if not tasks:
        return
    started = time.monotonic()
    # 1. Each task stages its state changes and a checkpoint (the input offset they cover) in its changelog
    #    partition, and says how far it consumed (nothing, if it never had a position).
    offsets = [offset for task in tasks for offset in task.prepare_commit()]
    txn.commits += 1
    if txn.abort_hook is not None and txn.abort_hook(txn.commits):
        raise TransactionAborted("injected abort (test hook)")
    if txn.transactional:
        steps = SlowCommit(txn.name, txn.timeout_s)
        with steps:
            # 2. The consumed offsets join the transaction, with the group's metadata as of now: the generation that
            #    owns these partitions. A zombie's are refused (docs/guarantees.md: zombies-stay-out).
            if offsets:
                group = consumer.consumer_group_metadata()
                txn.call(txn.producer.send_offsets_to_transaction, offsets, group, txn.timeout_s)
                steps.done("send_offsets_to_transaction")
            # 3. Every message acknowledged with its offset (a message librdkafka assumed written after a leader died
            #    may be missing: the transaction aborts instead of committing without it). The deliveries mostly
            #    completed during step 2, which waits on the coordinator meanwhile.
            txn.confirm_deliveries()
            steps.done("deliveries")
            # 4. Commit: outputs, changelog and offsets become visible together, or not at all. An unknown outcome is
            #    asked again (docs/guarantees.md: unknown-commit-retried).
            txn.call(txn.producer.commit_transaction, txn.timeout_s)
            steps.done("commit_transaction")
    else:  # at_least_once: outputs first (all of them acknowledged, or p rewinds), offsets after
        txn.confirm_deliveries()
        if offsets:
            consumer.commit(offsets=offsets, asynchronous=False)
    if txn.observe_commit is not None:
        txn.observe_commit(time.monotonic() - started)
    # 5. Each task moves its committed offset and state forward (the checkpoints' delivery reports served first:
    #    STATE_STORE=disk records the changelog offset each reaches; the flush before the commit served most).
    txn.poll()
    for task in txn.end():
        task.committed()


class SlowCommit:
    """Times a commit's steps; one that took longer than REQUEST_TIMEOUT_MS in all is logged (WARNING) with each
    step's time, finished or not: a commit was once seen stuck over 60 s after the transaction coordinator's broker
    restarted, with nothing to say where."""

    def __init__(self, name: str, limit_s: float) -> None:
        self.name, self.limit_s = name, limit_s
        self.started = self.last = time.monotonic()
        self.steps: list[str] = []

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{step} {now - self.last:.1f} s")
        self.last = now

    def __enter__(self) -> SlowCommit:
        return self

    def __exit__(self, error_type: object, error: object, traceback: object) -> None:
        total = time.monotonic() - self.started
        if total > self.limit_s:
            ended = (
                "" if error is None else f"; then {error_type.__name__ if isinstance(error_type, type) else error_type}"
            )
            steps = ", ".join(self.steps) or "none finished"
            log.warning("%s: commit took %.1f s (%s%s)", self.name, total, steps, ended)


def abort_transaction(txn: Transaction) -> None:
    """Aborts what `txn` holds, on a new producer from then on (`Transaction.renew`); every task in it goes back to its
    last commit: state undone, input sought back. PartitionDropped when the abort or the renewal is refused."""
    tasks = txn.end()
    if tasks and txn.transactional:
        txn.call(txn.producer.abort_transaction, txn.timeout_s)
        txn.renew()
    for task in tasks:
        task.rewind()


def abort_and_rewind(task: KafkaTask) -> None:
    """After a failure of `task`'s own: its transaction aborted (the others in it rewind too), or p alone rewound."""
    if task in task.txn.participants:
        abort_transaction(task.txn)
    else:
        task.rewind()


def close_task(task: KafkaTask, consumer: Consumer, commit: bool) -> None:
    """Ends p's ownership: its open work committed (revoked) or aborted (lost), then the producer flushed. Never
    raises: whatever is left open is aborted by the broker's transaction time-out or by the next owner's fence."""
    if task.phase is Phase.CLOSED:
        return
    txn = task.txn
    if commit and task.phase is Phase.RUNNING and task in txn.participants:
        try:
            commit_transaction(txn, consumer)
        except (TransactionAborted, PartitionDropped, KafkaException) as e:
            log.warning("p%d: could not commit on close: %s", task.partition, e)
    if task in txn.participants and task.phase is not Phase.DROPPED:
        # Aborted once, no retries; any others in it (per_process) rewind and run on a new producer (renew-after-abort)
        others = [t for t in txn.end() if t is not task]
        if txn.transactional and not txn.broken:
            try:
                txn.producer.abort_transaction(txn.timeout_s)
                log.info("%s: open transaction aborted (p%d closed)", txn.name, task.partition)
                if others:
                    txn.renew()
            except (KafkaException, PartitionDropped) as e:
                log.info("%s: open transaction not aborted or not renewed here (%s)", txn.name, e)
        for other in others:
            other.rewind()
    # A fenced or fatal producer delivers nothing more. One fenced behind our back (paused) fails the flush: inside a
    # rebalance callback with a SystemError around the KafkaException, which killed a worker in a fault run.
    with contextlib.suppress(*PRODUCER_CALL_FAILED):
        if not txn.broken:
            txn.producer.flush(txn.timeout_s)
    task.close()
