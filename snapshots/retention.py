"""Step 4 of a compaction run (driver, unless --keep-history): delete below the previous generation.

Once generation g is published on base B, AdminClient.delete_records removes the snapshot topic's records below B's
first chunk and the changelog's below B's covered offset. Two complete generations (B and g) and the changelog since
B remain, so a restore can fall back from a damaged g to B (docs/guarantees.md: complete-restore). A partition
published without a base deletes nothing. Deletion is best effort: a failure is logged and the next run tries again.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.kafka.offsets import low_watermarks
from pipeline.state.snapshot_format import Manifest
from snapshots.options import Options
from snapshots.plan import Plan
from snapshots.report import PartitionReport

log = logging.getLogger("snapshots.compact")


def delete_below_base(
    opts: Options,
    admin: AdminClient,
    plans: dict[int, Plan],
    published: dict[int, Manifest],
    reports: dict[int, PartitionReport],
) -> None:
    """Deletes below the base generation of each published partition; what was deleted goes into its report."""
    requests: list[TopicPartition] = []
    for p in published:
        base = plans[p].base
        if base is None:
            continue
        requests.append(TopicPartition(opts.snapshots, p, base.first_chunk_offset))
        requests.append(TopicPartition(opts.changelog, p, base.changelog_offset))
    if not requests:
        return
    lows = {
        topic: low_watermarks(admin, topic, list(published), opts.timeout_s)
        for topic in (opts.snapshots, opts.changelog)
    }
    requests = [tp for tp in requests if tp.offset > lows[tp.topic][tp.partition]]
    if not requests:
        return
    for tp, future in admin.delete_records(requests, request_timeout=opts.timeout_s).items():
        try:
            future.result(opts.timeout_s)
            reports[tp.partition].deleted[tp.topic] = tp.offset
        except KafkaException as e:  # retention is best effort: the next run tries again
            log.warning("delete_records %s[%d] below %d failed: %s", tp.topic, tp.partition, tp.offset, e)
