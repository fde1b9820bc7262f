"""Snapshots at restore (docs/guarantees.md: complete-restore, all-or-nothing-snapshots): the newest complete
snapshot + the changelog tail; damaged snapshots are skipped with a warning in favour of the previous one; a
changelog that no longer reaches a snapshot refuses; transaction markers and aborted records at the ends of both
topics never confuse "the latest"."""

from __future__ import annotations

import logging
import random

import pytest
from confluent_kafka import Producer, TopicPartition

from pipeline.state.changelog import CHECKPOINT_KEY
from pipeline.state.restore import RestoreError
from tests.snapshots.helpers import (
    Changelog,
    bounds_known,
    end_offsets,
    new_app,
    publish_snapshot,
    restore,
    restore_job,
    run_to_end,
)

KEYS = 300


@pytest.fixture
def history(kafka_admin, kafka_bootstrap) -> Changelog:
    """Partition 0 with two generations of snapshots written by hand, and changes after each."""
    log = new_app(kafka_admin, kafka_bootstrap, partitions=1, prefix="restore")
    log.random_history(random.Random(7), 40, KEYS)
    return log


def snapshot_now(log: Changelog, generation: int, damage: str | None = None):
    """A snapshot of partition 0 covering the changelog so far."""
    end = end_offsets(log.bootstrap, log.topic, 1)[0]
    return publish_snapshot(
        log,
        0,
        dict(log.folds[0]),
        changelog_offset=end,
        input_offset=log.committed(0),
        generation=generation,
        damage=damage,
    )


def changes_since(log: Changelog, records_before: int) -> int:
    return log.records[0] - records_before


def test_restore_uses_the_newest_snapshot_and_reads_only_the_tail(history, kafka_bootstrap):
    log = history
    snapshot_now(log, 1)
    log.random_history(random.Random(8), 20, KEYS)
    gen2, _ = snapshot_now(log, 2)
    before = log.records[0]
    log.random_history(random.Random(9), 10, KEYS)

    state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0]
    assert job.snapshot.snapshot_id == gen2.snapshot_id
    assert job.snapshot_entries == gen2.entries
    assert job.records == changes_since(log, before)  # the tail only, not the history below the snapshot
    assert not job.skipped


@pytest.mark.parametrize("damage", ["flip", "drop", "checksum", "count"])
def test_a_damaged_snapshot_falls_back_to_the_previous_one_with_a_warning(history, kafka_bootstrap, caplog, damage):
    log = history
    gen1, _ = snapshot_now(log, 1)
    before_gen1 = log.records[0]
    log.random_history(random.Random(8), 20, KEYS)
    snapshot_now(log, 2, damage=damage)
    log.random_history(random.Random(9), 10, KEYS)

    with caplog.at_level(logging.WARNING, logger="pipeline.state.restore"):
        state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0]
    assert job.snapshot.snapshot_id == gen1.snapshot_id
    assert job.records == changes_since(log, before_gen1)
    expected = {"flip": "CRC-32 mismatch", "drop": "1 of", "checksum": "checksum", "count": "the manifest says"}[damage]
    assert expected in job.skipped[0]
    assert "falling back to the previous one" in caplog.text


@pytest.mark.parametrize("damage", ["no-manifest", "half"])
def test_chunks_without_a_committed_manifest_are_no_snapshot(history, kafka_bootstrap, caplog, damage):
    log = history
    gen1, _ = snapshot_now(log, 1)
    log.random_history(random.Random(8), 20, KEYS)
    snapshot_now(log, 2, damage=damage)  # chunks written, manifest aborted or never written

    with caplog.at_level(logging.WARNING, logger="pipeline.state.restore"):
        state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0]
    assert job.snapshot.snapshot_id == gen1.snapshot_id
    assert not job.skipped  # nothing was published, so nothing is "damaged"
    assert "falling back" not in caplog.text


def test_only_snapshot_damaged_falls_back_to_the_whole_changelog(history, kafka_bootstrap, caplog):
    log = history
    snapshot_now(log, 1, damage="flip")
    with caplog.at_level(logging.WARNING, logger="pipeline.state.restore"):
        state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0]
    assert job.snapshot is None and job.records == log.records[0]
    assert "restoring from the whole changelog" in caplog.text


def delete_changelog_below(log: Changelog, offset: int, admin) -> None:
    tp = TopicPartition(log.topic, 0, offset)
    admin.delete_records([tp], request_timeout=10)[tp].result(10)


def test_changelog_truncated_past_the_snapshot_refuses(history, kafka_bootstrap, kafka_admin):
    log = history
    gen1, _ = snapshot_now(log, 1)
    log.random_history(random.Random(8), 20, KEYS)
    delete_changelog_below(log, gen1.changelog_offset + 5, kafka_admin)

    with pytest.raises(
        RestoreError,
        match=rf"starts at offset {gen1.changelog_offset + 5}, but the newest usable "
        rf"full snapshot {gen1.snapshot_id} .* only below {gen1.changelog_offset}",
    ):
        restore(kafka_bootstrap, log.app_id, 0, log.committed(0))


def test_truncated_changelog_with_only_a_damaged_snapshot_refuses_and_says_why(history, kafka_bootstrap, kafka_admin):
    log = history
    gen1, _ = snapshot_now(log, 1, damage="flip")
    delete_changelog_below(log, 10, kafka_admin)
    with pytest.raises(
        RestoreError,
        match=rf"starts at offset 10, not 0.*no usable full snapshot.*"
        rf"{gen1.snapshot_id}.*CRC-32 mismatch",
    ):
        restore(kafka_bootstrap, log.app_id, 0, log.committed(0))


def test_changelog_truncated_up_to_the_snapshot_is_fine(history, kafka_bootstrap, kafka_admin):
    log = history
    gen1, _ = snapshot_now(log, 1)
    log.random_history(random.Random(8), 20, KEYS)
    delete_changelog_below(log, gen1.changelog_offset, kafka_admin)  # what the compaction's retention does
    state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0] and job.snapshot.snapshot_id == gen1.snapshot_id


def test_snapshot_whose_checkpoint_disagrees_with_the_group_refuses(history, kafka_bootstrap):
    log = history
    snapshot_now(log, 1)
    with pytest.raises(
        RestoreError,
        match=rf"covers input offset {log.committed(0)} but the group's committed "
        r"offset is 3",
    ):
        restore(kafka_bootstrap, log.app_id, 0, 3)


def test_markers_and_aborted_transactions_at_the_ends_do_not_confuse_the_latest(kafka_admin, kafka_bootstrap):
    """Partition 0: after the newest manifest come an aborted generation (chunks + manifest), 40 aborted records
    (more than the first scan windows) and plain non-manifest records, each transaction leaving its marker.
    Partition 1: no snapshot at all, a changelog ending in aborted transactions. Partition 2: nothing at all."""
    log = new_app(kafka_admin, kafka_bootstrap, partitions=3, prefix="markers")
    rng = random.Random(3)
    log.random_history(rng, 30, KEYS, abort_ratio=0.0, only=[0, 1])
    end = end_offsets(log.bootstrap, log.topic, 3)[0]
    newest, _ = publish_snapshot(
        log, 0, dict(log.folds[0]), changelog_offset=end, input_offset=log.committed(0), generation=1
    )
    publish_snapshot(
        log,
        0,
        {"bogus": b"1", "more": b"2", "x": b"3", "y": b"4"},
        changelog_offset=end,
        input_offset=log.committed(0),
        generation=2,
        damage="no-manifest",
        chunk_bytes=20,
    )
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{log.app_id}.zombie"})
    zombie.init_transactions(30)
    for _ in range(4):
        zombie.begin_transaction()
        for i in range(10):
            zombie.produce(log.snapshots, b"aborted %d" % i, partition=0)
        zombie.flush(30)
        zombie.abort_transaction(30)
    zombie.begin_transaction()
    zombie.produce(log.snapshots, b"not a manifest", partition=0)
    zombie.commit_transaction(30)
    # A publish in flight (a compaction that crashed mid-transaction): its open transaction keeps the last stable
    # offset below the high watermark. Restore reads below it and does not wait for the transaction to time out.
    crashed = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"{log.app_id}.crashed",
            "transaction.timeout.ms": 60_000,
        }
    )
    crashed.init_transactions(30)
    crashed.begin_transaction()
    crashed.produce(log.snapshots, b"in flight", partition=0)
    crashed.flush(30)
    # Changelog tails: the last transactions of partitions 0 and 1 are aborted, so end-1 is an abort marker.
    for p in (0, 1):
        log.transaction(p, {"late": b"aborted"}, commit=False)
        log.transaction(p, {"later": b"aborted too"}, commit=False)

    state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0] and job.snapshot.snapshot_id == newest.snapshot_id
    assert job.records == 0  # the changelog after the snapshot holds only aborted records and markers
    assert job.snapshot_records > 8  # the first window held no manifest: the scan had to grow
    assert job.seconds < 10  # well below the open transaction's 60 s time-out
    crashed.abort_transaction(30)

    state, job = restore(kafka_bootstrap, log.app_id, 1, log.committed(1))
    assert state == log.folds[1] and job.snapshot is None and job.records == log.records[1]

    state, job = restore(kafka_bootstrap, log.app_id, 2, None)
    assert state == {} and job.snapshot is None and job.records == 0


def test_records_deleted_under_a_running_restore_make_it_start_over(history, kafka_bootstrap, kafka_admin):
    """The compaction job may delete below the previous generation while a restore reads: the restore must notice
    (never jump over the gap) and start over from the then newest snapshot."""
    log = history
    job = restore_job(kafka_bootstrap, log.app_id, 0, log.committed(0))
    try:
        bounds_known(job)  # captured: no snapshot yet
        gen1, _ = snapshot_now(log, 1)
        delete_changelog_below(log, gen1.changelog_offset, kafka_admin)  # what the job's retention would do
        state = run_to_end(job)
    finally:
        job.close()
    assert state == log.folds[0]
    assert job.restarts == 1
    assert job.snapshot.snapshot_id == gen1.snapshot_id and job.records == 0


def test_a_snapshot_whose_chunks_were_deleted_is_skipped(history, kafka_bootstrap, kafka_admin, caplog):
    log = history
    snapshot_now(log, 1)
    _, gen2_offset = snapshot_now(log, 2)
    tp = TopicPartition(log.snapshots, 0, gen2_offset)  # gen2's manifest stays, its chunks go
    kafka_admin.delete_records([tp], request_timeout=10)[tp].result(10)
    with caplog.at_level(logging.WARNING, logger="pipeline.state.restore"):
        state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0] and job.snapshot is None  # gen1 is gone too: the whole changelog
    assert "were deleted" in job.skipped[0]


def test_a_state_key_spelled_like_the_checkpoint_key_is_state_not_a_checkpoint(kafka_admin, kafka_bootstrap):
    # Restore folds a batch with C-level loops and recognises checkpoints by key and header: a user's key that
    # happens to be the checkpoint key (no header) must land in the state, and the checkpoint must still be found.
    log = new_app(kafka_admin, kafka_bootstrap, partitions=1, prefix="restore")
    rng = random.Random(3)
    log.random_history(rng, 10, KEYS)
    log.transaction(0, {CHECKPOINT_KEY.decode(): b"a user's value", "k1": b"x"})
    log.random_history(rng, 10, KEYS)

    state, job = restore(kafka_bootstrap, log.app_id, 0, log.committed(0))
    assert state == log.folds[0]
    assert state[CHECKPOINT_KEY.decode()] == b"a user's value"
    assert job.last_checkpoint.next_input_offset == log.committed(0)
