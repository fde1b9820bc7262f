"""Fence before restore (docs/guarantees.md: fence-first). Whatever a zombie commits before the new owner's fence
must be seen by what the new owner reads after it. A runner that reads offsets and restores state first, then
fences, misses the zombie's last commit and processes those records again: the broken double shows the test can tell
the two apart."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid

from confluent_kafka import Consumer, TopicPartition

from pipeline import settings
from pipeline.core.lifecycle import Phase
from pipeline.examples.running_totals import app as totals
from pipeline.sinks.kafka.commit import commit_transaction
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import PartitionDropped
from pipeline.testing import checker, inputs
from tests.support import eventually


class RestoreBeforeFenceRunner(KafkaRunner):
    """Test double breaking fence-first: reads p's committed offset and restores p's state, then fences."""

    def _take_over(self, partitions: list[int], reassign: bool) -> None:
        tasks = [self._new_task(p) for p in partitions]
        committed = self._committed_offsets(partitions)
        for task in tasks:
            task.start_all(committed[task.partition], restore=True)
            self.restores.start(task.partition, task.committed_offset)
            # Stepped through the manager as the real runner does: right after the topics are created the start
            # may be deferred (no leader yet) and retried a second later, so there is no running restore to step.
            finished: list = []
            while not finished:
                finished = [r for r in self.restores.step() if r.partition == task.partition]
            restore = finished[0]
            task.restored(restore.state, restore.snapshot, restore.end)
        self._fence(tasks)
        self.input.incremental_assign(
            [TopicPartition(self.input_topic, p, committed[p][self.input_topic] or 0) for p in partitions]
        )
        for task in tasks:
            self.tasks[task.partition] = task


def zombie_with_open_transaction(runner: KafkaRunner, bootstrap: str) -> KafkaTask:
    """A previous owner of p0 that processed every input record in a transaction it has not committed yet."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": runner.app_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(runner.input_topic, 0, 0)])
    zombie = KafkaTask(dataclasses.replace(runner.ctx, consumer=consumer), 0, runner._transaction_for(0))
    zombie.txn.fence()
    zombie.start(None)
    zombie.phase = Phase.RUNNING
    records = []
    while len(records) < 50:
        records += [m for m in consumer.consume(50, 1.0) if not m.error()]
    zombie.process(records)
    return zombie


def run_takeover(runner_class: type[KafkaRunner], bootstrap: str) -> checker.Verdict:
    suffix = uuid.uuid4().hex[:8]
    app = totals.with_topics(f"in-{suffix}", f"out-{suffix}")
    inputs.create_topics(bootstrap, {app.input_topic: 1, app.output_topic: 1})
    inputs.produce_running_totals(bootstrap, app.input_topic, 50, partitions=1)
    # A producer per partition: the fence under test is init_transactions on transactional.id(p).
    config = settings.load(env={}, bootstrap_servers=bootstrap, app_id=f"rule1-{suffix}", producers="per_partition")
    zombie: KafkaTask | None = None

    class ZombieCommitsJustBeforeTheFence(runner_class):
        def _fence(self, tasks):
            with contextlib.suppress(PartitionDropped):
                # the last thing a zombie can do: everything read after the fence sees it
                commit_transaction(zombie.txn, zombie.ctx.consumer)
            super()._fence(tasks)

    runner = ZombieCommitsJustBeforeTheFence(app, config)
    runner.open()
    zombie = zombie_with_open_transaction(runner, bootstrap)
    runner._take_over([0], reassign=False)
    eventually(lambda: runner._loop_once() or runner.tasks[0].next_offset == 50, timeout_s=30, interval_s=0)
    runner._commit(runner.tasks[0].txn)
    runner._shutdown()
    return checker.verify(
        app,
        bootstrap,
        dead_letter_topic=runner.dead_letter_topic,
        changelog_topic=runner.changelog_topic,
        group_id=runner.app_id,
        timeout_s=30,
    )


def test_fencing_first_keeps_the_zombie_out(kafka_bootstrap):
    verdict = run_takeover(KafkaRunner, kafka_bootstrap)
    assert verdict.ok, verdict.summary()


def test_restoring_before_fencing_lets_the_zombie_double_outputs(kafka_bootstrap):
    verdict = run_takeover(RestoreBeforeFenceRunner, kafka_bootstrap)
    assert not verdict.ok
    assert verdict.duplicates.count == 50, verdict.summary()
