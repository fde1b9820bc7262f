"""Snapshots of an App with several inputs (pipeline.examples.order_fills): the Spark compaction and the snapshot on
shutdown both name every input's offset in the manifest, and an instance that restores from such a snapshot alone
(no checkpoint in the changelog after it) starts, checks them against the group's offsets, and stays exactly-once.
A manifest naming only the first input made that restore refuse to start (docs/inputs.md)."""

from __future__ import annotations

import types

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.examples import order_fills
from pipeline.testing.faults import FaultRun, produce_paced
from pipeline.testing.harness import wait_caught_up
from snapshots.compact import Options, compact
from tests.faults.conftest import assert_exactly_once
from tests.snapshots.test_snapshot_compaction import manifests
from tests.support import eventually

pytestmark = pytest.mark.spark
SPEC = "pipeline.examples.order_fills:app"
PARTITIONS = 2


def committed(run: FaultRun) -> dict[int, dict[str, int]]:
    consumer = Consumer({"bootstrap.servers": run.bootstrap, "group.id": run.app_id, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(s.topic, p) for s in run.run_app.streams for p in range(PARTITIONS)]
        result: dict[int, dict[str, int]] = {}
        for tp in consumer.committed(tps, timeout=10):
            result.setdefault(tp.partition, {})[tp.topic] = tp.offset
        return result
    finally:
        consumer.close()


def produce(run: FaultRun, records: list) -> None:
    produce_paced(run.bootstrap, None, [(topic + run.suffix, *rest) for topic, *rest in records], 0.5)


def restored_from_snapshots(instance) -> None:
    """Every partition restored, each from a snapshot (a refused checkpoint would have stopped the process)."""

    def restored() -> list[str]:
        lines = [line for line in instance.log_path.read_text().splitlines() if " restored: " in line]
        return lines if len(lines) == PARTITIONS else []

    lines = eventually(restored, 60)
    assert all("(no snapshot)" not in line for line in lines), lines


def caught_up(run: FaultRun) -> None:
    lag = wait_caught_up(run.bootstrap, run.app_id, run.run_app.co_partitioned, PARTITIONS, 120)
    assert not lag, f"lag {lag}\n{run.fleet.logs() if run.fleet else ''}"


def test_compaction_and_shutdown_snapshots_name_every_input_and_restore_alone(spark, kafka_bootstrap, tmp_path):
    run = FaultRun(order_fills.app, SPEC, kafka_bootstrap, PARTITIONS, tmp_path / "logs")
    records = list(order_fills.generate(3_000, PARTITIONS, 31))
    try:
        produce(run, records[:2_000])
        first = run.start(1).alive[0]
        caught_up(run)
        report = compact(spark, Options(kafka_bootstrap, run.app_id, timeout_s=30))
        assert sorted(report.published) == [0, 1], report.summary()
        log = types.SimpleNamespace(bootstrap=kafka_bootstrap, snapshots=f"{run.app_id}-snapshots")
        offsets = committed(run)
        for p in range(PARTITIONS):
            assert manifests(log, p)[0].input_offsets == offsets[p]

        first.kill()  # nothing processed since the compaction: the restore has the snapshot and no checkpoint after
        second = run.fleet.start(1, PIPELINE_SNAPSHOT_ON_SHUTDOWN="true")[0]
        restored_from_snapshots(second)
        produce(run, records[2_000:])
        caught_up(run)
        assert second.terminate() == 0  # publishes a snapshot of each partition on the way out
        offsets = committed(run)
        for p in range(PARTITIONS):
            assert manifests(log, p)[0].input_offsets == offsets[p]

        restored_from_snapshots(run.fleet.start(1)[0])  # from the shutdown snapshots alone
        outcome = run.finish()
    finally:
        run.abandon()
    assert_exactly_once(outcome)
    assert outcome.verdict.app.count == 0, outcome.verdict.app.samples
