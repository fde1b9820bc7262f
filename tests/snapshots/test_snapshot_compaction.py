"""The Spark compaction job on real Kafka: its snapshots restore to exactly the fold of the changelog, it falls back
from a damaged base, it is a no-op when nothing changed, and two runs at once publish once
(docs/guarantees.md: all-or-nothing-snapshots)."""

from __future__ import annotations

import random
import re

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.kafka.offsets import CheckedConsumer, high_watermarks, low_watermarks
from pipeline.state.snapshot_finder import scan_all
from pipeline.state.snapshot_format import Manifest
from snapshots.compact import compact
from tests.snapshots.helpers import Changelog, end_offsets, new_app, options, publish_snapshot, restore
from tests.support import eventually

pytestmark = pytest.mark.spark
PARTITIONS = 2
KEYS = 400


def manifests(log: Changelog, p: int) -> list[Manifest]:
    """Every committed manifest of p, newest first."""
    from confluent_kafka import Consumer

    from pipeline.kafka.offsets import stable_end_offsets

    admin = AdminClient({"bootstrap.servers": log.bootstrap})
    low = low_watermarks(admin, log.snapshots, [p], 10)[p]
    # commit_transaction returns before the coordinator has written the markers: until it has, the last stable
    # offset stays below a manifest just published. Nothing else writes here, so wait for LSO == high watermark.

    def settled() -> tuple[int] | None:
        lso = stable_end_offsets(admin, log.snapshots, [p], 10)[p]
        return (lso,) if lso == high_watermarks(admin, log.snapshots, [p], 10)[p] else None

    (end,) = eventually(settled, 10)
    consumer = CheckedConsumer(
        Consumer(
            {
                "bootstrap.servers": log.bootstrap,
                "group.id": "t",
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
            }
        )
    )
    try:
        return [m for _, m in scan_all(consumer, log.snapshots, p, low, end, 30).candidates]
    finally:
        consumer.close()


def assert_restores_to_the_fold(log: Changelog, tail_records: dict[int, int] | None = None) -> None:
    for p in range(log.partitions):
        state, job = restore(log.bootstrap, log.app_id, p, log.committed(p))
        assert state == log.folds[p], f"p{p}"
        if tail_records is not None and p in tail_records:
            assert job.records == tail_records[p], f"p{p}: read {job.records} changelog records"
            assert job.snapshot is not None


def test_round_trip_random_states_with_deletes(spark, kafka_admin, kafka_bootstrap):
    log = new_app(kafka_admin, kafka_bootstrap, PARTITIONS, prefix="roundtrip")
    rng = random.Random(11)
    log.random_history(rng, 80, KEYS, delete_ratio=0.3)

    first = compact(spark, options(log))
    assert first.published == [0, 1], first.summary()
    gen1 = {p: manifests(log, p)[0] for p in range(PARTITIONS)}
    assert all(m.generation == 1 and m.entries == len(log.folds[p]) for p, m in gen1.items())
    assert_restores_to_the_fold(log, tail_records={0: 0, 1: 0})

    before = dict(log.records)
    log.random_history(rng, 40, KEYS, delete_ratio=0.5)  # many keys deleted since generation 1
    second = compact(spark, options(log))
    assert second.published == [0, 1], second.summary()
    for p in range(PARTITIONS):
        report = second.partitions[p]
        assert report.base_id == gen1[p].snapshot_id and report.base_entries == gen1[p].entries
        assert report.changelog_records == log.records[p] - before[p]  # only what came after generation 1
        assert manifests(log, p)[0].generation == 2
    assert_restores_to_the_fold(log, tail_records={0: 0, 1: 0})

    before = dict(log.records)
    log.random_history(rng, 10, KEYS)
    assert_restores_to_the_fold(log, tail_records={p: log.records[p] - before[p] for p in range(PARTITIONS)})


def test_damaged_base_is_skipped_and_the_next_generation_built_on_the_previous_one(spark, kafka_admin, kafka_bootstrap):
    log = new_app(kafka_admin, kafka_bootstrap, 1, prefix="damagedbase")
    rng = random.Random(5)
    log.random_history(rng, 30, KEYS)
    assert compact(spark, options(log)).published == [0]
    gen1 = manifests(log, 0)[0]
    log.random_history(rng, 20, KEYS)
    end = end_offsets(log.bootstrap, log.topic, 1)[0]
    broken, _ = publish_snapshot(
        log, 0, dict(log.folds[0]), changelog_offset=end, input_offset=log.committed(0), generation=2, damage="flip"
    )
    log.random_history(rng, 10, KEYS)

    report = compact(spark, options(log))
    assert report.published == [0], report.summary()
    assert report.partitions[0].base_id == gen1.snapshot_id
    assert broken.snapshot_id in report.partitions[0].reason
    newest = manifests(log, 0)[0]
    assert newest.generation == 3 and newest.previous_id == gen1.snapshot_id
    assert_restores_to_the_fold(log, tail_records={0: 0})


def test_two_runs_at_once_publish_once_and_a_rerun_is_a_no_op(spark, kafka_admin, kafka_bootstrap):
    log = new_app(kafka_admin, kafka_bootstrap, PARTITIONS, prefix="concurrent")
    log.random_history(random.Random(2), 40, KEYS)
    inner = []

    def concurrent_run() -> None:
        # Run B starts while A holds its open publish transaction: B's init_transactions fences A.
        inner.append(compact(spark, options(log)))

    outer = compact(spark, options(log), before_commit=concurrent_run)
    assert inner[0].published == [0, 1], inner[0].summary()
    assert outer.published == [], outer.summary()
    assert all("fenced by a concurrent compaction" in r.reason for r in outer.partitions.values())
    for p in range(PARTITIONS):
        found = manifests(log, p)
        assert len(found) == 1  # A's manifests were aborted with its transaction
        assert found[0].snapshot_id == inner[0].partitions[p].snapshot_id
    ends = end_offsets(log.bootstrap, log.snapshots, PARTITIONS)

    rerun = compact(spark, options(log))
    assert rerun.published == [] and not rerun.failed
    assert all("no new changelog records" in r.reason for r in rerun.partitions.values())
    assert end_offsets(log.bootstrap, log.snapshots, PARTITIONS) == ends  # wrote nothing at all
    assert_restores_to_the_fold(log, tail_records={0: 0, 1: 0})


def test_a_run_that_finds_a_newer_manifest_after_fencing_skips(spark, kafka_admin, kafka_bootstrap):
    """Same inputs, same snapshot id: the second run sees the first one's manifest and does not publish again."""
    log = new_app(kafka_admin, kafka_bootstrap, 1, prefix="recheck")
    log.random_history(random.Random(3), 20, KEYS)
    from snapshots import publish as job

    plans = []
    original = job.publish_manifests

    def publish_after_another_run(*args, **kwargs):
        job.publish_manifests = original
        plans.append(compact(spark, options(log)))  # B runs start to end between A's fold and A's publish
        return original(*args, **kwargs)

    job.publish_manifests = publish_after_another_run
    try:
        outer = compact(spark, options(log))
    finally:
        job.publish_manifests = original
    assert plans[0].published == [0]
    assert outer.published == [] and "another compaction published" in outer.partitions[0].reason
    assert outer.partitions[0].reason.endswith(f"its chunks {plans[0].partitions[0].snapshot_id} stay unreferenced")
    assert len(manifests(log, 0)) == 1


def test_retention_keeps_two_complete_generations_and_the_changelog_since_the_older(
    spark, kafka_admin, kafka_bootstrap
):
    """After generation g is published on base g-1, everything below g-1 goes; g-1 stays complete, and so does the
    changelog since it: a restore could still fall back from g to g-1."""
    log = new_app(kafka_admin, kafka_bootstrap, 1, prefix="retention")
    rng = random.Random(4)
    for _ in range(3):
        log.random_history(rng, 15, KEYS)
        assert compact(spark, options(log)).published == [0]
    gen3, gen2 = manifests(log, 0)  # newest first: generation 1 is gone
    assert [m.generation for m in (gen3, gen2)] == [3, 2]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert low_watermarks(admin, log.snapshots, [0], 10)[0] == gen2.first_chunk_offset
    assert low_watermarks(admin, log.topic, [0], 10)[0] == gen2.changelog_offset
    # Falling back to generation 2 still gives exactly the fold: its chunks + the changelog since it.
    state = load_generation(log, gen2)
    fold_tail(log, gen2.changelog_offset, state)
    assert state == log.folds[0]
    assert_restores_to_the_fold(log, tail_records={0: 0})

    log.random_history(rng, 5, KEYS)
    keep = compact(spark, options(log, truncate=False))  # --keep-history: publishes, deletes nothing
    assert keep.published == [0] and not keep.partitions[0].deleted
    assert low_watermarks(admin, log.topic, [0], 10)[0] == gen2.changelog_offset


def load_generation(log: Changelog, manifest: Manifest) -> dict[str, bytes]:
    from confluent_kafka import Consumer

    from pipeline.state.snapshot_finder import ChunkLoad

    consumer = Consumer(
        {
            "bootstrap.servers": log.bootstrap,
            "group.id": "t",
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    low = low_watermarks(AdminClient({"bootstrap.servers": log.bootstrap}), log.snapshots, [0], 10)[0]
    offset = next(
        o
        for o, m in scan_all(
            CheckedConsumer(consumer), log.snapshots, 0, low, end_offsets(log.bootstrap, log.snapshots, 1)[0], 30
        ).candidates
        if m.snapshot_id == manifest.snapshot_id
    )
    try:
        load = ChunkLoad(CheckedConsumer(consumer), log.snapshots, 0, offset, manifest)
        while not load.done:
            load.step(1)
        return load.finish()
    finally:
        consumer.close()


def fold_tail(log: Changelog, start: int, state: dict[str, bytes]) -> None:
    from confluent_kafka import Consumer

    from pipeline.kafka.offsets import TailReader, read_to_end
    from pipeline.state.changelog import is_checkpoint

    consumer = Consumer(
        {
            "bootstrap.servers": log.bootstrap,
            "group.id": "t",
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        }
    )
    try:
        end = end_offsets(log.bootstrap, log.topic, 1)[0]
        for m in read_to_end(TailReader(consumer, log.topic, {0: start}, {0: end}), 30):
            if is_checkpoint(m.key(), m.headers()):
                continue
            if m.value() is None:
                state.pop(m.key().decode(), None)
            else:
                state[m.key().decode()] = m.value()
    finally:
        consumer.close()


def test_the_command_prints_what_it_read_wrote_and_skipped(spark, kafka_admin, kafka_bootstrap, capsys):
    """`snapshots compact` end to end (in this process, so it reuses the test session): partition 0 gets a snapshot,
    partition 1's keys were all deleted (a snapshot of the empty state: no chunks), partition 2 has no changes."""
    from snapshots.cli import main

    log = new_app(kafka_admin, kafka_bootstrap, 3, prefix="cli")
    log.random_history(random.Random(6), 10, KEYS, only=[0])
    log.transaction(1, {"a": b"1", "b": b"2"})
    log.transaction(1, {"a": None, "b": None})
    args = ["compact", "--bootstrap-servers", kafka_bootstrap, "--app-id", log.app_id, "--timeout", "30"]

    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(
        rf"p0: published \w+ \(generation 1\): read 0 entries of no previous snapshot and "
        rf"{log.records[0]} changelog records \[0, \d+\); wrote 1 chunks, {len(log.folds[0])} entries",
        out,
    )
    assert re.search(
        rf"p1: published \w+ \(generation 1\): .* {log.records[1]} changelog records .*wrote 0 chunks, "
        r"0 entries",
        out,
    )
    assert "p2: skipped: no new changelog records" in out
    assert "compaction: 2 published, 0 failed, 1 skipped" in out
    assert_restores_to_the_fold(log, tail_records={0: 0, 1: 0})  # p1: the empty state from a chunk-less snapshot

    log.transaction(2, {"c": b"3"})
    tp = TopicPartition(log.topic, 2, 1)  # p2 loses a change no snapshot covers: compaction, like restore, refuses
    kafka_admin.delete_records([tp], request_timeout=10)[tp].result(10)
    assert main(args) == 1
    assert re.search(
        r"p2: failed: .*-changelog\[2\] starts at offset 1 but there is no usable snapshot", capsys.readouterr().out
    )
