"""Step 3 of a compaction run (driver): the manifests of all written partitions, last, in one fenced transaction.

A transactional producer with transactional.id `<app>.snapshot-publisher` (stable per app) calls init_transactions,
which fences any concurrent run (docs/guarantees.md: zombies-stay-out); then the newest manifest of each partition is
read again and a partition whose newest manifest is no longer the one this run started from (another run, or the
pipeline's snapshot on shutdown, published meanwhile) is skipped. The manifests of all remaining partitions go out in
one transaction, last: until it commits, the chunks written by step 2 are no snapshot at all
(docs/guarantees.md: all-or-nothing-snapshots). A run fenced at commit publishes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pipeline.kafka.errors import is_fenced, kafka_error
from pipeline.kafka.offsets import Reading, low_watermarks, stable_end_offsets
from pipeline.kafka.permissions import missing_transactional_id
from pipeline.state.snapshot_finder import ManifestScan
from pipeline.state.snapshot_format import Manifest
from pipeline.state.snapshot_writer import manifest_for, produce_manifest
from snapshots.fold import Folded
from snapshots.options import CompactionError, Options
from snapshots.plan import Plan
from snapshots.report import PartitionReport


def publish_manifests(
    opts: Options,
    consumer: Reading,
    admin: AdminClient,
    plans: dict[int, Plan],
    written: dict[int, Folded],
    reports: dict[int, PartitionReport],
    before_commit: Callable[[], None] | None,
) -> dict[int, Manifest]:
    """The manifests published, by partition (none if fenced); a report for every written partition.
    `before_commit` (tests) runs inside the transaction, just before its commit."""
    producer = _fenced_publisher(opts)
    manifests = _still_newest(opts, consumer, admin, plans, written, reports)
    if not manifests:
        return {}
    try:
        producer.begin_transaction()
        for manifest in manifests.values():
            produce_manifest(producer, opts.snapshots, manifest)
        if before_commit is not None:
            before_commit()
        producer.commit_transaction(opts.timeout_s)
    except KafkaException as e:
        error = kafka_error(e)
        if error is not None and (is_fenced(error) or error.fatal()):
            for p in manifests:
                reports[p] = PartitionReport(
                    p, "skipped", f"fenced by a concurrent compaction run ({error}): published nothing"
                )
            return {}
        raise CompactionError(f"publishing the manifests failed: {e}") from e
    for p, manifest in manifests.items():
        plan, folded = plans[p], written[p]
        reports[p] = PartitionReport(
            p,
            "published",
            snapshot_id=manifest.snapshot_id,
            generation=manifest.generation,
            base_id=manifest.previous_id,
            changelog_range=(plan.start, plan.end),
            changelog_records=folded.changelog_records,
            base_entries=folded.base_entries,
            chunks=manifest.chunks,
            entries=manifest.entries,
            bytes=manifest.bytes,
            reason="; ".join(f"skipped invalid snapshot {x}" for x in plan.invalid),
        )
    return manifests


def _fenced_publisher(opts: Options) -> Producer:
    producer = Producer(opts.publisher_config())
    try:
        producer.init_transactions(opts.timeout_s)  # fences any other run of this app's compaction
    except KafkaException as e:
        if (missing := missing_transactional_id(e.args[0], opts.publisher_id)) is not None:
            raise CompactionError(str(missing)) from e
        raise CompactionError(
            f"cannot initialise the publisher {opts.publisher_id!r} within {opts.timeout_s:.0f}s "
            f"({e.args[0]}); the chunks written stay unreferenced, a rerun redoes them"
        ) from e
    return producer


def _still_newest(
    opts: Options,
    consumer: Reading,
    admin: AdminClient,
    plans: dict[int, Plan],
    written: dict[int, Folded],
    reports: dict[int, PartitionReport],
) -> dict[int, Manifest]:
    """After fencing: the manifest of each written partition whose newest manifest is still the one it was planned
    on; the others are reported skipped."""
    ends = stable_end_offsets(admin, opts.snapshots, list(written), opts.timeout_s)
    lows = low_watermarks(admin, opts.snapshots, list(written), opts.timeout_s)
    manifests: dict[int, Manifest] = {}
    for p, folded in written.items():
        plan = plans[p]
        newest = _newest_manifest_offset(consumer, opts, p, lows[p], ends[p])
        if newest != plan.newest_offset:
            reports[p] = PartitionReport(
                p,
                "skipped",
                f"another compaction published the manifest at "
                f"{opts.snapshots}[{p}]@{newest} after this run started (from "
                f"{plan.newest_offset}); its chunks {plan.snapshot_id} stay unreferenced",
            )
            continue
        assert folded.chunks is not None  # a written partition has its chunks
        manifests[p] = manifest_for(
            folded.chunks,
            generation=plan.generation,
            partition=p,
            changelog_topic=opts.changelog,
            changelog_offset=plan.end,
            input_offset=folded.input_offset,
            input_offsets=folded.input_offsets,
            previous_id=plan.base.snapshot_id if plan.base else None,
            changelog_records=folded.changelog_records,
            first_chunk_offset=ends[p],  # an empty state: a manifest with no chunks, placed at the end
        )
    return manifests


def _newest_manifest_offset(consumer: Reading, opts: Options, p: int, low: int, end: int) -> int | None:
    scan = ManifestScan(consumer, opts.snapshots, p, low, end, on_skip=lambda offset, why: None)
    deadline = time.monotonic() + opts.timeout_s
    while scan.newest_offset is None and not scan.exhausted:
        if time.monotonic() > deadline:
            raise CompactionError(f"{opts.snapshots}[{p}]: newest manifest not found in time ({scan.stuck()})")
        scan.step(0.5)
    return scan.newest_offset
