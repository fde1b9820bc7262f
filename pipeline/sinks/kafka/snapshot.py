"""SNAPSHOT_ON_SHUTDOWN: on a clean stop, each partition's committed state published as a full snapshot, so that the
next owner restores from it instead of replaying the changelog (docs/guarantees.md: all-or-nothing-snapshots)."""

from __future__ import annotations

import contextlib
import logging
import time

from pipeline.core.lifecycle import Phase
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import PRODUCER_CALL_FAILED, PartitionDropped, TransactionAborted
from pipeline.state.snapshot_format import Manifest
from pipeline.state.snapshot_writer import write_snapshot

log = logging.getLogger(__name__)


def publish_shutdown_snapshot(task: KafkaTask, snapshot_topic: str) -> Manifest | None:
    """Publishes p's committed state as a full snapshot, in a transaction of its own on p's producer (a fenced owner
    publishes nothing). Call it with nothing open in that producer's transaction. None when nothing was published:
    nothing new since the snapshot p was restored from, the changelog offset the state covers is not known exactly,
    or the broker refused (logged)."""
    txn, ctx = task.txn, task.ctx
    if not (ctx.app.stateful and ctx.settings.exactly_once) or task.phase is not Phase.RUNNING or txn.open:
        return None
    if txn.broken or not len(task.state):
        return None
    started = time.monotonic()
    try:
        txn.producer.flush(txn.timeout_s)  # serves the last checkpoint's delivery report
        coverage = task.snapshot_coverage()
        if coverage is None:
            return None
        base, changelog_end = coverage
        txn.call(txn.producer.begin_transaction)
        manifest = write_snapshot(
            txn.producer,
            app_id=ctx.app_id,
            snapshot_topic=snapshot_topic,
            changelog_topic=ctx.changelog_topic,
            partition=task.partition,
            entries=task.state.encoded_items(),
            changelog_offset=changelog_end,
            input_offset=task.committed_offset,
            input_offsets=task.committed_offsets_by_topic(),
            base=base,
            timeout_s=txn.timeout_s,
        )
        txn.call(txn.producer.commit_transaction, txn.timeout_s)
    # Fenced while it looked silent (a fault run: another process's heartbeat thread fenced it), the producer fails
    # the flush with a SystemError around the lost fatal error, and the instance exited with code 1 instead of stopping.
    except (*PRODUCER_CALL_FAILED, TransactionAborted, PartitionDropped) as e:
        log.warning("p%d: snapshot on shutdown not published: %s", task.partition, e)
        with contextlib.suppress(*PRODUCER_CALL_FAILED):
            txn.producer.abort_transaction(txn.timeout_s)
        return None
    task.snapshot_base = manifest
    log.info(
        "p%d: snapshot %s published on shutdown: %d entries in %d chunks, covers changelog < %d and input < %s (%.2fs)",
        task.partition,
        manifest.snapshot_id,
        manifest.entries,
        manifest.chunks,
        manifest.changelog_offset,
        manifest.input_offset,
        time.monotonic() - started,
    )
    return manifest
