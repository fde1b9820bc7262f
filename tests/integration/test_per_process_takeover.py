"""PRODUCERS=per_process (KIP-447): the zombie is fenced by the group, not by a transactional.id, so a new owner cannot
abort the previous owner's open transaction. It must wait for it instead: committed offsets are read stable, and the
restore reads the changelog to its last stable offset (docs/guarantees.md: zombies-stay-out). Here the previous owner
has already put p's offsets into its transaction (pending) when the new owner takes p over:

- it commits 3 s later: the new owner waits for that, then starts after it (restoring what it wrote);
- it never ends: the new owner waits until the broker aborts it (TRANSACTION_TIMEOUT_MS), then redoes its work.

Either way each input record counts exactly once. A new owner that read the offsets unstable would start before the
zombie's records and count them twice (red on purpose: isolation.level=read_uncommitted, which drops require_stable).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer

from pipeline import settings
from pipeline.core.lifecycle import Phase
from pipeline.examples.running_totals import app as totals
from pipeline.kafka.clients import consumer_config, producer_config
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import Transaction
from pipeline.testing import checker, inputs
from tests.support import eventually

RECORDS = 50
TRANSACTION_TIMEOUT_MS = 6_000


@dataclasses.dataclass
class Zombie:
    task: KafkaTask
    consumer: Consumer

    def commit(self) -> None:
        self.task.txn.call(self.task.producer.commit_transaction, 10)


def zombie_with_pending_offsets(runner: KafkaRunner, config: settings.Settings) -> Zombie:
    """A member of the group that processed all of p0 and sent p0's offsets into its transaction, then left the
    group without committing or aborting (as a process stopped between send_offsets and commit would)."""
    # A hand-built member without the runner's on_assign (which seeks to the beginning when nothing is committed):
    # it needs the reset that the runtime turns off.
    consumer = Consumer({**consumer_config(config, runner.app_id), "auto.offset.reset": "earliest"})
    consumer.subscribe([runner.input_topic])
    producer = Producer(producer_config(config, f"{runner.app_id}.zombie"))
    txn = Transaction(producer, config, "zombie")
    task = KafkaTask(dataclasses.replace(runner.ctx, consumer=consumer), 0, txn)
    txn.fence()
    task.start(None)
    task.phase = Phase.RUNNING
    records: list = []
    deadline = time.monotonic() + 30
    while len(records) < RECORDS and time.monotonic() < deadline:
        records += [m for m in consumer.consume(RECORDS, 1.0) if not m.error()]
    assert len(records) == RECORDS
    task.process(records)
    offsets = task.prepare_commit()
    txn.call(producer.send_offsets_to_transaction, offsets, consumer.consumer_group_metadata(), 10)
    consumer.close()  # leaves the group: p0 goes to the next member, the transaction stays open
    return Zombie(task, consumer)


@pytest.fixture
def setup(kafka_bootstrap: str) -> Iterator[tuple[KafkaRunner, settings.Settings]]:
    suffix = uuid.uuid4().hex[:8]
    app = totals.with_topics(f"in-{suffix}", f"out-{suffix}")
    inputs.create_topics(kafka_bootstrap, {app.input_topic: 1, app.output_topic: 1})
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, RECORDS, partitions=1)
    config = settings.load(
        env={},
        bootstrap_servers=kafka_bootstrap,
        app_id=f"kip447-{suffix}",
        producers="per_process",
        transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        commit_interval_ms=200,
    )
    runner = KafkaRunner(app, config)
    runner.open()
    yield runner, config
    runner.stop()


def take_over(runner: KafkaRunner) -> tuple[threading.Thread, float]:
    """Starts the new owner; returns its thread and when it started."""
    thread = threading.Thread(target=runner.run, daemon=True)
    started = time.monotonic()
    thread.start()
    return thread, started


def owns_p0_running(runner: KafkaRunner) -> bool:
    task = runner.tasks.get(0)
    return task is not None and task.phase is Phase.RUNNING


def verdict(runner: KafkaRunner, thread: threading.Thread) -> checker.Verdict:
    eventually(lambda: runner.tasks[0].committed_offset == RECORDS, timeout_s=30, interval_s=0.1)
    runner.stop()
    thread.join(30)
    return checker.verify(
        runner.app,
        runner.settings.bootstrap_servers,
        dead_letter_topic=runner.dead_letter_topic,
        changelog_topic=runner.changelog_topic,
        group_id=runner.app_id,
        timeout_s=30,
    )


def test_new_owner_waits_for_the_previous_owners_commit(setup):
    runner, config = setup
    zombie = zombie_with_pending_offsets(runner, config)
    thread, started = take_over(runner)
    time.sleep(3)
    assert not owns_p0_running(runner), "the new owner started while offsets of p0 were pending"
    zombie.commit()
    eventually(lambda: owns_p0_running(runner), timeout_s=30, interval_s=0.05)
    waited = time.monotonic() - started
    result = verdict(runner, thread)
    assert result.ok, result.summary()
    assert result.outputs == RECORDS
    print(f"take-over waited {waited:.1f}s for a commit 3 s away")  # BENCHMARKS.md, not a limit


def test_new_owner_waits_out_a_transaction_that_never_ends(setup):
    runner, config = setup
    zombie_with_pending_offsets(runner, config)  # never commits nor aborts: the broker aborts it on time-out
    thread, started = take_over(runner)
    eventually(lambda: owns_p0_running(runner), timeout_s=60, interval_s=0.05)
    waited = time.monotonic() - started
    result = verdict(runner, thread)
    assert result.ok, result.summary()
    assert result.outputs == RECORDS
    print(f"take-over waited {waited:.1f}s for a transaction that never ends")  # bounded by TRANSACTION_TIMEOUT_MS
