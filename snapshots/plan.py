"""Step 1 of a compaction run (driver): what each partition's next snapshot is made of.

Per partition p: the snapshot topic's p is scanned for manifests (growing windows back from the last stable offset,
read_committed); the newest usable one becomes the base B. The changelog range is [B's covered offset, LSO) where LSO
is the changelog's last stable offset now: every record below it is decided, so Spark never waits on an open pipeline
transaction. An empty range is skipped (no-op); a changelog whose start was deleted past B fails p. The snapshot id
is a hash of (app, p, B's id, range): the same inputs always give the same id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.offsets import Reading, low_watermarks, stable_end_offsets
from pipeline.kafka.topics import SNAPSHOT_CONFIG
from pipeline.state.snapshot_finder import InvalidSnapshot, precheck, scan_all
from pipeline.state.snapshot_format import Manifest, snapshot_id
from snapshots.options import CompactionError, Options
from snapshots.report import PartitionReport

log = logging.getLogger("snapshots.compact")


@dataclass(frozen=True)
class Bounds:
    """Partition p's offsets, read once when the run starts."""

    changelog_low: int  # the changelog's first offset (above 0 once retention deleted below a generation)
    changelog_end: int  # the changelog's last stable offset: the new snapshot covers the changelog below it
    snapshot_low: int  # the snapshot topic's first offset: a manifest whose chunks start below it is unusable


@dataclass
class Plan:
    """Partition p's next snapshot: base B (None: the empty state) + the changelog in [start, end)."""

    partition: int
    bounds: Bounds
    start: int  # B's covered changelog offset (0 without a base)
    base: Manifest | None
    base_offset: int | None  # offset of B's manifest: B's chunks lie in [B.first_chunk_offset, base_offset)
    older: list[tuple[int, Manifest]]  # the manifests below B, newest first: the fall-backs if B turns out damaged
    newest_offset: int | None  # offset of p's newest manifest record at planning time (publish checks it again)
    generation: int
    snapshot_id: str
    invalid: list[str] = field(default_factory=list)  # "<id>: <why>" of the snapshots skipped on the way

    @property
    def end(self) -> int:
        return self.bounds.changelog_end


def ensure_snapshot_topic(admin: AdminClient, opts: Options) -> list[int]:
    """The changelog's partitions; creates the snapshot topic with as many if it does not exist yet."""
    try:
        topics = admin.list_topics(timeout=opts.timeout_s).topics
    except KafkaException as e:
        raise CompactionError(
            f"no cluster metadata from {opts.bootstrap_servers} within {opts.timeout_s:.0f}s ({e.args[0]})"
        ) from e
    if opts.changelog not in topics or topics[opts.changelog].error is not None:
        raise CompactionError(
            f"changelog topic {opts.changelog!r} does not exist: wrong --app-id, or the pipeline never ran"
        )
    partitions = sorted(topics[opts.changelog].partitions)
    if opts.snapshots not in topics:
        future = admin.create_topics(
            [NewTopic(opts.snapshots, len(partitions), -1, config=SNAPSHOT_CONFIG)], request_timeout=opts.timeout_s
        )[opts.snapshots]
        try:
            future.result(opts.timeout_s)
        except KafkaException as e:
            if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:
                raise CompactionError(f"cannot create {opts.snapshots!r}: {e.args[0]}") from e
    elif len(topics[opts.snapshots].partitions) != len(partitions):
        raise CompactionError(
            f"{opts.snapshots!r} has {len(topics[opts.snapshots].partitions)} partitions, the "
            f"changelog {len(partitions)}: partition p of both must belong together"
        )
    return partitions


def plan_partitions(
    opts: Options, admin: AdminClient, consumer: Reading, partitions: list[int]
) -> tuple[dict[int, Plan], dict[int, PartitionReport]]:
    """A plan for each partition with new changelog records, a report (skipped or failed) for each other one."""
    changelog_low = low_watermarks(admin, opts.changelog, partitions, opts.timeout_s)
    changelog_end = stable_end_offsets(admin, opts.changelog, partitions, opts.timeout_s)
    snapshot_low = low_watermarks(admin, opts.snapshots, partitions, opts.timeout_s)
    snapshot_end = stable_end_offsets(admin, opts.snapshots, partitions, opts.timeout_s)
    plans: dict[int, Plan] = {}
    reports: dict[int, PartitionReport] = {}
    for p in partitions:
        scan = scan_all(consumer, opts.snapshots, p, snapshot_low[p], snapshot_end[p], opts.timeout_s)
        bounds = Bounds(changelog_low[p], changelog_end[p], snapshot_low[p])
        planned = plan_partition(opts, p, bounds, scan.candidates, scan.newest_offset, [])
        if isinstance(planned, Plan):
            plans[p] = planned
        else:
            reports[p] = planned
    return plans, reports


def plan_partition(
    opts: Options,
    p: int,
    bounds: Bounds,
    candidates: list[tuple[int, Manifest]],
    newest_offset: int | None,
    invalid: list[str],
    newest_generation: int = 0,
) -> Plan | PartitionReport:
    """p's plan on the newest usable of `candidates` (newest first), or why there is none to make."""
    base, base_offset, older = None, None, list(candidates)
    newest_generation = max([newest_generation, *(m.generation for _, m in candidates)])
    while older:
        offset, manifest = older.pop(0)
        try:
            precheck(manifest, p, opts.changelog, bounds.changelog_end, bounds.snapshot_low)
        except InvalidSnapshot as e:
            invalid.append(f"{manifest.snapshot_id}: {e}")
            log.warning("p%d: snapshot %s not usable as a base: %s", p, manifest.snapshot_id, e)
            continue
        base, base_offset = manifest, offset
        break
    start = base.changelog_offset if base else 0
    if bounds.changelog_low > start:
        what = f"snapshot {base.snapshot_id} covers it only below {start}" if base else "there is no usable snapshot"
        return PartitionReport(
            p,
            "failed",
            f"{opts.changelog}[{p}] starts at offset {bounds.changelog_low} but "
            f"{what}: the changes in between are gone; this partition cannot be compacted (nor "
            "restored). Rebuild the state by reprocessing the input into a new app id.",
        )
    if start >= bounds.changelog_end:
        return PartitionReport(
            p,
            "skipped",
            f"no new changelog records (snapshot "
            f"{base.snapshot_id if base else '-'} covers the changelog up to {start}, "
            f"it ends at {bounds.changelog_end})",
            snapshot_id=base.snapshot_id if base else None,
            generation=base.generation if base else None,
        )
    sid = snapshot_id(opts.app_id, p, base.snapshot_id if base else None, start, bounds.changelog_end)
    generation = max(newest_generation, base.generation if base else 0) + 1
    return Plan(p, bounds, start, base, base_offset, older, newest_offset, generation, sid, invalid)


def plan_on_older(opts: Options, plan: Plan, why: str) -> Plan | PartitionReport:
    """p planned again after its base turned out damaged (found by the fold): on the next older snapshot."""
    assert plan.base is not None  # only a base can turn out damaged
    log.warning(
        "p%d: previous snapshot %s is not valid (%s); falling back to the one before",
        plan.partition,
        plan.base.snapshot_id,
        why,
    )
    plan.invalid.append(f"{plan.base.snapshot_id}: {why}")
    return plan_partition(
        opts, plan.partition, plan.bounds, plan.older, plan.newest_offset, plan.invalid, plan.generation - 1
    )
