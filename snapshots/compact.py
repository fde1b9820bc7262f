"""The compaction job: folds the latest full snapshot of each partition and the changelog since into the next one.

    snapshots compact --bootstrap-servers HOST:9092 --app-id APP [--master local[2]]
    spark-submit --jars <kafka connector jars> snapshots/compact.py --bootstrap-servers ... --app-id APP

Per partition p of `<app>-changelog`, in four stages:

1. plan (driver): the snapshot topic's p is scanned for manifests (growing windows back from the last stable offset,
   read_committed); the newest one becomes the base B. The changelog range is [B.changelog_offset, LSO) where LSO is
   the changelog's last stable offset now: every record below it is decided, so Spark never waits on an open
   pipeline transaction. An empty range is skipped (no-op). The snapshot id is a hash of (app, p, B's id, range):
   the same inputs always give the same id.
2. fold (Spark, executors): Spark's Kafka source reads both ranges with kafka.isolation.level=read_committed,
   explicit startingOffsets/endingOffsets per partition and failOnDataLoss=true. Each changelog partition is read
   as one or more Spark partitions (minPartitions = the cores), each a contiguous offset range read in offset order,
   so `mapInArrow` folds each piece with dict updates (last write wins; the offset order is checked, not assumed)
   down to one row per key with the offset of its last write, plus the piece's last checkpoint. B's chunks are decoded
   and CRC-checked the same way. One shuffle (`groupBy(partition).applyInArrow`) brings B's entries and p's folded
   changes together: B is verified against its manifest (all chunks, entries, checksum) -- if it is not valid, the
   partition is planned again on the previous snapshot -- then the pieces' last writes are applied in offset
   order, tombstones dropped, keys sorted
   (so chunk boundaries and CRCs are deterministic), and the chunks are written from that executor with an
   idempotent producer. A partition's state lives in one Python worker, exactly as it does in the live pipeline.
   Writing from the executors keeps the data off the driver; a retried task writes the same chunks again, which
   readers skip as duplicates by (snapshot id, index).
3. publish (driver): a transactional producer with transactional.id `<app>.snapshot-publisher` (stable per app)
   calls init_transactions, which fences any concurrent run; then the newest manifest of each partition is read
   again and a partition whose newest manifest is no longer the one this run started from is skipped. The
   manifests of all remaining partitions go out in one transaction, last. A run fenced at commit publishes nothing.
4. retention (driver, unless --keep-history): once generation g is published on base B, records of the snapshot
   topic below B's first chunk and of the changelog below B's covered offset are deleted (AdminClient
   delete_records). Two complete generations (B and g) and the changelog since B always remain, so a restore can
   fall back from a damaged g to B.

The live pipeline needs no restart: its next restore of p uses the newest snapshot. The job prints what it read,
wrote and skipped per partition and exits 0 when nothing failed (skips included), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.errors import is_fenced, kafka_error
from pipeline.kafka.clients import produce_waiting
from pipeline.kafka.offsets import CheckedConsumer, low_watermarks, stable_end_offsets
from pipeline.kafka.topics import SNAPSHOT_CONFIG
from pipeline.state.changelog import CHECKPOINT_KEY, changelog_topic
from pipeline.state.snapshot_finder import InvalidSnapshot, ManifestScan, precheck, scan_all
from pipeline.state.snapshot_format import (
    DEFAULT_CHUNK_BYTES,
    MANIFEST_HEADER,
    Manifest,
    now_iso,
    snapshot_id,
    snapshot_topic,
)

log = logging.getLogger("snapshots.compact")
FOLD_SCHEMA = "partition int, kind int, key string, value binary, ord long, info string"
RESULT_SCHEMA = "partition int, status string, info string"
ENTRY, CHANGE, CHUNK_META, CHANGELOG_META = 0, 1, 2, 3
OUT_BATCH_ROWS = 100_000


class CompactionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Options:
    bootstrap_servers: str
    app_id: str
    changelog_topic: str = ""
    snapshot_topic: str = ""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    truncate: bool = True  # delete below the previous generation after publishing
    timeout_s: float = 60.0
    kafka: dict[str, str] = field(default_factory=dict)  # extra librdkafka properties (driver and chunk producers)
    spark_kafka: dict[str, str] = field(default_factory=dict)  # extra Java client properties for Spark's source

    @property
    def changelog(self) -> str:
        return self.changelog_topic or changelog_topic(self.app_id)

    @property
    def snapshots(self) -> str:
        return self.snapshot_topic or snapshot_topic(self.app_id)

    @property
    def publisher_id(self) -> str:
        return f"{self.app_id}.snapshot-publisher"

    def client(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}


@dataclass
class Plan:
    partition: int
    start: int
    end: int
    base: Manifest | None
    base_offset: int | None
    older: list[tuple[int, Manifest]]
    newest_offset: int | None
    generation: int
    snapshot_id: str
    invalid: list[str] = field(default_factory=list)


@dataclass
class PartitionReport:
    partition: int
    status: str  # published | skipped | failed
    reason: str = ""
    snapshot_id: str | None = None
    generation: int | None = None
    base_id: str | None = None
    changelog_range: tuple[int, int] | None = None
    changelog_records: int = 0
    base_entries: int = 0
    chunks: int = 0
    entries: int = 0
    bytes: int = 0
    deleted: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        if self.status == "published":
            rng = self.changelog_range
            text = (f"p{self.partition}: published {self.snapshot_id} (generation {self.generation}): read "
                    f"{self.base_entries} entries of {self.base_id or 'no previous snapshot'} and "
                    f"{self.changelog_records} changelog records [{rng[0]}, {rng[1]}); wrote {self.chunks} chunks, "
                    f"{self.entries} entries, {self.bytes} bytes")
            if self.deleted:
                text += "; deleted below " + ", ".join(f"{t}@{o}" for t, o in self.deleted.items())
            return text
        return f"p{self.partition}: {self.status}: {self.reason}"


@dataclass
class Report:
    partitions: dict[int, PartitionReport]
    seconds: float = 0.0

    @property
    def published(self) -> list[int]:
        return [p for p, r in self.partitions.items() if r.status == "published"]

    @property
    def failed(self) -> list[int]:
        return [p for p, r in self.partitions.items() if r.status == "failed"]

    def summary(self) -> str:
        lines = [r.line() for _, r in sorted(self.partitions.items())]
        records = sum(r.changelog_records for r in self.partitions.values())
        lines.append(f"compaction: {len(self.published)} published, {len(self.failed)} failed, "
                     f"{len(self.partitions) - len(self.published) - len(self.failed)} skipped; {records} changelog "
                     f"records in {self.seconds:.1f}s")
        return "\n".join(lines)


# -- the job -----------------------------------------------------------------------------------------------------
def compact(spark, opts: Options, before_commit: Callable[[], None] | None = None) -> Report:
    """One compaction run. `before_commit` (tests) runs inside the publish transaction, just before its commit."""
    started = time.monotonic()
    # Bigger Arrow batches: fewer Python calls per changelog record (the fold is a few dict updates per batch).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
    admin = AdminClient(opts.client())
    partitions = _ensure_snapshot_topic(admin, opts)
    cl_low = low_watermarks(admin, opts.changelog, partitions, opts.timeout_s)
    cl_end = stable_end_offsets(admin, opts.changelog, partitions, opts.timeout_s)
    reports: dict[int, PartitionReport] = {}
    plans: dict[int, Plan] = {}
    consumer = _consumer(opts)
    try:
        snap_low = low_watermarks(admin, opts.snapshots, partitions, opts.timeout_s)
        snap_end = stable_end_offsets(admin, opts.snapshots, partitions, opts.timeout_s)
        for p in partitions:
            scan = scan_all(consumer, opts.snapshots, p, snap_low[p], snap_end[p], opts.timeout_s)
            plan_or_report = _plan(opts, p, scan.candidates, scan.newest_offset, cl_low[p], cl_end[p], [],
                                   snapshot_low=snap_low[p])
            if isinstance(plan_or_report, Plan):
                plans[p] = plan_or_report
            else:
                reports[p] = plan_or_report
        written = _fold_and_write(spark, opts, plans, cl_low, cl_end, snap_low, reports)
        if written:
            _publish(opts, consumer, admin, plans, written, reports, before_commit)
    finally:
        consumer.close()
    report = Report(dict(sorted(reports.items())), time.monotonic() - started)
    return report


def _plan(opts: Options, p: int, candidates: list[tuple[int, Manifest]], newest_offset: int | None, low: int,
          end: int, invalid: list[str], newest_generation: int = 0, snapshot_low: int = 0) -> Plan | PartitionReport:
    base, base_offset, older = None, None, list(candidates)
    newest_generation = max([newest_generation, *(m.generation for _, m in candidates)])
    while older:
        offset, manifest = older.pop(0)
        try:
            precheck(manifest, p, opts.changelog, end, snapshot_low)
        except InvalidSnapshot as e:
            invalid.append(f"{manifest.snapshot_id}: {e}")
            log.warning("p%d: snapshot %s not usable as a base: %s", p, manifest.snapshot_id, e)
            continue
        base, base_offset = manifest, offset
        break
    start = base.changelog_offset if base else 0
    if low > start:
        what = f"snapshot {base.snapshot_id} covers it only below {start}" if base else "there is no usable snapshot"
        return PartitionReport(p, "failed", f"{opts.changelog}[{p}] starts at offset {low} but {what}: the "
                               "changes in between are gone; this partition cannot be compacted (nor restored). "
                               "Rebuild the state by reprocessing the input into a new app id.")
    if start >= end:
        return PartitionReport(p, "skipped", f"no new changelog records (snapshot "
                               f"{base.snapshot_id if base else '-'} covers the changelog up to {start}, "
                               f"it ends at {end})", snapshot_id=base.snapshot_id if base else None,
                               generation=base.generation if base else None)
    sid = snapshot_id(opts.app_id, p, base.snapshot_id if base else None, start, end)
    generation = max(newest_generation, base.generation if base else 0) + 1
    return Plan(p, start, end, base, base_offset, older, newest_offset, generation, sid, invalid)


def _fold_and_write(spark, opts: Options, plans: dict[int, Plan], cl_low: dict[int, int], cl_end: dict[int, int],
                    snap_low: dict[int, int], reports: dict[int, PartitionReport]) -> dict[int, dict]:
    """Runs the Spark rounds; a partition whose base turns out invalid is planned again on the previous one."""
    written: dict[int, dict] = {}
    pending = dict(plans)
    while pending:
        results = _spark_round(spark, opts, pending)
        retry: dict[int, Plan] = {}
        for p, plan in pending.items():
            status, info = results.get(p, ("empty", {}))
            if status == "written":
                written[p] = info
            elif status == "empty":
                reports[p] = PartitionReport(p, "skipped", f"no new committed changelog records in "
                                             f"[{plan.start}, {plan.end}) (only markers or aborted records)")
                plans.pop(p)
            elif status == "base_invalid":
                log.warning("p%d: previous snapshot %s is not valid (%s); falling back to the one before",
                            p, plan.base.snapshot_id, info["reason"])
                plan.invalid.append(f"{plan.base.snapshot_id}: {info['reason']}")
                again = _plan(opts, p, plan.older, plan.newest_offset, cl_low[p], cl_end[p], plan.invalid,
                              plan.generation - 1, snap_low[p])
                if isinstance(again, Plan):
                    retry[p] = plans[p] = again
                else:
                    reports[p] = again
                    plans.pop(p)
            else:
                raise CompactionError(f"p{p}: unexpected result {status}: {info}")
        pending = retry
    return written


def _spark_round(spark, opts: Options, plans: dict[int, Plan]) -> dict[int, tuple[str, dict]]:
    # minPartitions splits long changelog ranges over all cores; the fold handles pieces of a partition (each piece
    # is read in offset order, the merge orders the pieces' last writes by offset).
    changelog = _kafka_range(spark, opts, opts.changelog, {p: (pl.start, pl.end) for p, pl in plans.items()},
                             min_partitions=spark.sparkContext.defaultParallelism)
    changelog = changelog.selectExpr(
        "partition", "offset", "CAST(key AS STRING) AS key", "value",
        f"COALESCE(CAST(key AS STRING) = '{CHECKPOINT_KEY.decode()}' AND "
        "exists(headers, h -> h.key = 'eos.checkpoint'), false) AS is_checkpoint",
    )
    parts = [changelog.mapInArrow(_fold_changelog, FOLD_SCHEMA)]
    bases = {p: pl for p, pl in plans.items() if pl.base is not None}
    if bases:
        ranges = {p: (pl.base.first_chunk_offset, pl.base_offset) for p, pl in bases.items()}
        ids = {p: pl.base.snapshot_id for p, pl in bases.items()}
        chunks = _kafka_range(spark, opts, opts.snapshots, ranges).selectExpr(
            "partition", "offset", "value",
            "COALESCE(exists(headers, h -> h.key = 'eos.snapshot' AND CAST(h.value AS STRING) = 'chunk'), false) "
            "AS is_chunk",
        )
        parts.append(chunks.mapInArrow(_decoder(ids), FOLD_SCHEMA))
    rows = reduce(lambda a, b: a.unionByName(b), parts)
    specs = {p: _write_spec(opts, pl) for p, pl in plans.items()}
    writer = _merge_and_write(specs, _producer_config(opts), opts.snapshots, opts.chunk_bytes)
    results = rows.groupBy("partition").applyInArrow(writer, RESULT_SCHEMA).collect()
    return {r.partition: (r.status, json.loads(r.info)) for r in results}


def _kafka_range(spark, opts: Options, topic: str, ranges: dict[int, tuple[int, int]], min_partitions: int = 0):
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", opts.bootstrap_servers)
        .option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", json.dumps({topic: {str(p): s for p, (s, _) in ranges.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, (_, e) in ranges.items()}}))
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
    )
    if min_partitions > len(ranges):
        reader = reader.option("minPartitions", str(min_partitions))
    for key, value in opts.spark_kafka.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


def _write_spec(opts: Options, plan: Plan) -> dict:
    base = plan.base
    return {
        "snapshot_id": plan.snapshot_id,
        "base": None if base is None else {"snapshot_id": base.snapshot_id, "chunks": base.chunks,
                                           "entries": base.entries, "checksum": base.checksum,
                                           "input_offset": base.input_offset},
    }


def _producer_config(opts: Options) -> dict:
    return {
        **opts.client(),
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 20,
        "message.timeout.ms": int(opts.timeout_s * 1000),
    }


# -- executor-side functions (pickled by Spark: no closures over the driver's clients) ------------------------------
def _fold_changelog(batches: Iterator) -> Iterator:
    """One changelog partition in offset order -> one row per key touched (last write and its offset) + one meta row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.state.changelog import Checkpoint

    folds: dict[int, tuple[dict, dict, dict]] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for p in pc.unique(batch.column("partition")).to_pylist():
            part = batch if batch.num_rows and _single(batch) else batch.filter(pc.equal(batch.column("partition"), p))
            values, offsets, meta = folds.setdefault(p, ({}, {}, {"records": 0, "last": -1, "checkpoint": None,
                                                                "checkpoint_offset": -1}))
            off = part.column("offset").to_numpy()
            if off[0] <= meta["last"] or (len(off) > 1 and not bool(np.all(np.diff(off) > 0))):
                raise RuntimeError(f"changelog partition {p}: offsets out of order; the fold needs offset order")
            meta["last"] = int(off[-1])
            meta["records"] += part.num_rows
            is_cp = part.column("is_checkpoint")
            if pc.any(is_cp).as_py():
                cps = part.filter(is_cp)
                meta["checkpoint"] = Checkpoint.decode(cps.column("value")[-1].as_py()).next_input_offset
                meta["checkpoint_offset"] = cps.column("offset")[-1].as_py()
                part = part.filter(pc.invert(is_cp))
            keys = part.column("key").to_pylist()
            values.update(zip(keys, part.column("value").to_pylist(), strict=True))
            offsets.update(zip(keys, part.column("offset").to_pylist(), strict=True))
    for p, (values, offsets, meta) in folds.items():
        keys = list(values)
        for i in range(0, len(keys), OUT_BATCH_ROWS):
            part = keys[i : i + OUT_BATCH_ROWS]
            yield _rows(pa, p, CHANGE, part, [values[k] for k in part], [offsets[k] for k in part])
        yield _rows(pa, p, CHANGELOG_META, [None], [None], [meta["last"]], [json.dumps(meta)])


def _single(batch) -> bool:
    import pyarrow.compute as pc

    bounds = pc.min_max(batch.column("partition"))
    return bounds["min"].as_py() == bounds["max"].as_py()


def _rows(pa, p: int, kind: int, keys: list, values: list, ords: list, infos: list | None = None):
    n = len(keys)
    return pa.RecordBatch.from_arrays(
        [pa.array([p] * n, pa.int32()), pa.array([kind] * n, pa.int32()), pa.array(keys, pa.string()),
         pa.array(values, pa.binary()), pa.array(ords, pa.int64()), pa.array(infos or [None] * n, pa.string())],
        names=["partition", "kind", "key", "value", "ord", "info"],
    )


def _decoder(ids: dict[int, str]) -> Callable:
    def decode(batches: Iterator) -> Iterator:
        import pyarrow as pa

        from pipeline.state.snapshot_format import CorruptChunk, decode_chunk, peek_chunk

        for batch in batches:
            cols = batch.to_pydict()
            for p, offset, value, is_chunk in zip(cols["partition"], cols["offset"], cols["value"], cols["is_chunk"],
                                                  strict=True):
                if not is_chunk:
                    continue
                try:
                    sid, index = peek_chunk(value)
                    if sid != ids.get(p):
                        continue
                    _, index, keys, values, crc = decode_chunk(value)
                except CorruptChunk as e:
                    yield _rows(pa, p, CHUNK_META, [ids.get(p)], [None], [offset],
                                [json.dumps({"error": f"offset {offset}: {e}"})])
                    continue
                for i in range(0, len(keys), OUT_BATCH_ROWS):
                    yield _rows(pa, p, ENTRY, keys[i : i + OUT_BATCH_ROWS], values[i : i + OUT_BATCH_ROWS],
                                [-1] * len(keys[i : i + OUT_BATCH_ROWS]))
                yield _rows(pa, p, CHUNK_META, [sid], [None], [offset],
                            [json.dumps({"index": index, "entries": len(keys), "crc": crc})])

    return decode


def _merge_and_write(specs: dict[int, dict], producer_config: dict, topic: str, chunk_bytes: int) -> Callable:
    def merge(table):
        import pyarrow as pa
        import pyarrow.compute as pc
        from confluent_kafka import Producer

        from pipeline.state.snapshot_format import (
            CHUNK_HEADER,
            chunk_key,
            encode_chunk,
            manifest_checksum,
            split_chunks,
        )

        p = table.column("partition")[0].as_py()
        spec = specs[p]

        def result(status: str, info: dict):
            return pa.table({"partition": pa.array([p], pa.int32()), "status": [status], "info": [json.dumps(info)]})

        kinds = table.column("kind")
        metas = [json.loads(x) for x in table.filter(pc.equal(kinds, CHANGELOG_META)).column("info").to_pylist()]
        records = sum(m["records"] for m in metas)
        if records == 0:
            return result("empty", {})
        checkpoints = [(m["checkpoint_offset"], m["checkpoint"]) for m in metas if m["checkpoint"] is not None]
        base = spec["base"]
        entries: dict[str, bytes] = {}
        if base is not None:
            chunk_rows = table.filter(pc.equal(kinds, CHUNK_META))
            crcs: dict[int, int] = {}
            counts: dict[int, int] = {}
            errors = []
            for info in chunk_rows.column("info").to_pylist():
                info = json.loads(info)
                if "error" in info:
                    errors.append(info["error"])
                elif info["index"] not in crcs:
                    crcs[info["index"]] = info["crc"]
                    counts[info["index"]] = info["entries"]
            rows = table.filter(pc.equal(kinds, ENTRY))
            entries = dict(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
            missing = [i for i in range(base["chunks"]) if i not in crcs]
            reason = None
            if missing or len(crcs) != base["chunks"]:
                reason = f"{len(missing)} of {base['chunks']} chunks missing or corrupt {errors[:3]}"
            elif sum(counts.values()) != base["entries"] or len(entries) != base["entries"]:
                reason = f"{len(entries)} entries, the manifest says {base['entries']}"
            elif manifest_checksum([crcs[i] for i in range(base["chunks"])]) != base["checksum"]:
                reason = "checksum disagrees with the manifest"
            if reason:
                return result("base_invalid", {"reason": reason})
        base_entries = len(entries)
        changes = table.filter(pc.equal(kinds, CHANGE))
        if changes.num_rows:
            changes = changes.take(pc.sort_indices(changes.column("ord")))  # robust even if a partition was split
            entries.update(zip(changes.column("key").to_pylist(), changes.column("value").to_pylist(), strict=True))
        items = sorted((k, v) for k, v in entries.items() if v is not None)
        input_offset = max(checkpoints)[1] if checkpoints else (base["input_offset"] if base else None)

        producer = Producer(producer_config)
        delivered: dict[int, int] = {}
        failures: list[str] = []

        def on_delivery(error, message, index):
            if error is not None:
                failures.append(f"chunk {index}: {error}")
            else:
                delivered[index] = message.offset()

        chunk_crcs, total_bytes, sid = [], 0, spec["snapshot_id"]
        for index, (keys, values) in enumerate(split_chunks(items, chunk_bytes)):
            payload, crc = encode_chunk(sid, index, keys, values)
            chunk_crcs.append(crc)
            total_bytes += len(payload)
            produce_waiting(producer, topic, payload, chunk_key(sid, index), partition=p, headers=[CHUNK_HEADER],
                            on_delivery=lambda e, m, i=index: on_delivery(e, m, i))
            producer.poll(0)
        remaining = producer.flush(producer_config["message.timeout.ms"] / 1000 + 5)
        if remaining or failures or len(delivered) != len(chunk_crcs):
            raise RuntimeError(f"snapshot {sid} p{p}: chunks not written ({remaining} undelivered, {failures[:3]})")
        info = {
            "chunks": len(chunk_crcs), "entries": len(items), "bytes": total_bytes,
            "checksum": manifest_checksum(chunk_crcs), "first_chunk_offset": min(delivered.values(), default=None),
            "input_offset": input_offset, "changelog_records": records, "base_entries": base_entries,
        }
        return result("written", info)

    return merge


# -- publish and retention (driver) ----------------------------------------------------------------------------------
def _publish(opts: Options, consumer: Consumer, admin: AdminClient, plans: dict[int, Plan], written: dict[int, dict],
             reports: dict[int, PartitionReport], before_commit: Callable[[], None] | None) -> None:
    producer = Producer({**opts.client(), "transactional.id": opts.publisher_id, "enable.idempotence": True,
                         "acks": "all", "transaction.timeout.ms": int(max(opts.timeout_s, 10) * 1000)})
    try:
        producer.init_transactions(opts.timeout_s)  # fences any other run of this app's compaction
    except KafkaException as e:
        raise CompactionError(f"cannot initialise the publisher {opts.publisher_id!r} within {opts.timeout_s:.0f}s "
                              f"({e.args[0]}); the chunks written stay unreferenced, a rerun redoes them") from e
    ends = stable_end_offsets(admin, opts.snapshots, list(written), opts.timeout_s)
    lows = low_watermarks(admin, opts.snapshots, list(written), opts.timeout_s)
    manifests: dict[int, Manifest] = {}
    for p, info in written.items():
        plan = plans[p]
        newest = _newest_manifest_offset(consumer, opts, p, lows[p], ends[p])
        if newest != plan.newest_offset:
            reports[p] = PartitionReport(p, "skipped", f"another compaction published the manifest at "
                                         f"{opts.snapshots}[{p}]@{newest} after this run started (from "
                                         f"{plan.newest_offset}); its chunks {plan.snapshot_id} stay unreferenced")
            continue
        if info["first_chunk_offset"] is None:  # an empty state: a manifest with no chunks, placed at the end
            info["first_chunk_offset"] = ends[p]
        manifests[p] = Manifest(
            snapshot_id=plan.snapshot_id, generation=plan.generation, partition=p, changelog_topic=opts.changelog,
            changelog_offset=plan.end, input_offset=info["input_offset"], chunks=info["chunks"],
            entries=info["entries"], bytes=info["bytes"], checksum=info["checksum"],
            first_chunk_offset=info["first_chunk_offset"], created_at=now_iso(),
            previous_id=plan.base.snapshot_id if plan.base else None, changelog_records=info["changelog_records"],
        )
    if not manifests:
        return
    try:
        producer.begin_transaction()
        for p, manifest in manifests.items():
            producer.produce(opts.snapshots, manifest.encode(), manifest.snapshot_id.encode(), partition=p,
                             headers=[MANIFEST_HEADER])
        if before_commit is not None:
            before_commit()
        producer.commit_transaction(opts.timeout_s)
    except KafkaException as e:
        error = kafka_error(e)
        if error is not None and (is_fenced(error) or error.fatal()):
            for p in manifests:
                reports[p] = PartitionReport(p, "skipped", f"fenced by a concurrent compaction run ({error}): "
                                             "published nothing")
            return
        raise CompactionError(f"publishing the manifests failed: {e}") from e
    for p, manifest in manifests.items():
        plan, info = plans[p], written[p]
        reports[p] = PartitionReport(
            p, "published", snapshot_id=manifest.snapshot_id, generation=manifest.generation,
            base_id=manifest.previous_id, changelog_range=(plan.start, plan.end),
            changelog_records=info["changelog_records"], base_entries=info["base_entries"], chunks=manifest.chunks,
            entries=manifest.entries, bytes=manifest.bytes,
            reason="; ".join(f"skipped invalid snapshot {x}" for x in plan.invalid),
        )
    if opts.truncate:
        _retention(opts, admin, plans, manifests, reports)


def _newest_manifest_offset(consumer: Consumer, opts: Options, p: int, low: int, end: int) -> int | None:
    scan = ManifestScan(consumer, opts.snapshots, p, low, end, on_skip=lambda offset, why: None)
    deadline = time.monotonic() + opts.timeout_s
    while scan.newest_offset is None and not scan.exhausted:
        if time.monotonic() > deadline:
            raise CompactionError(f"{opts.snapshots}[{p}]: newest manifest not found in time ({scan.stuck()})")
        scan.step(0.5)
    return scan.newest_offset


def _retention(opts: Options, admin: AdminClient, plans: dict[int, Plan], manifests: dict[int, Manifest],
               reports: dict[int, PartitionReport]) -> None:
    """Deletes below the base generation: the base and the new generation (and the changelog since the base) stay."""
    requests: list[TopicPartition] = []
    for p in manifests:
        base = plans[p].base
        if base is None:
            continue
        requests.append(TopicPartition(opts.snapshots, p, base.first_chunk_offset))
        requests.append(TopicPartition(opts.changelog, p, base.changelog_offset))
    if not requests:
        return
    lows = {topic: low_watermarks(admin, topic, list(manifests), opts.timeout_s)
            for topic in (opts.snapshots, opts.changelog)}
    requests = [tp for tp in requests if tp.offset > lows[tp.topic][tp.partition]]
    if not requests:
        return
    for tp, future in admin.delete_records(requests, request_timeout=opts.timeout_s).items():
        try:
            future.result(opts.timeout_s)
            reports[tp.partition].deleted[tp.topic] = tp.offset
        except KafkaException as e:  # retention is best effort: the next run tries again
            log.warning("delete_records %s[%d] below %d failed: %s", tp.topic, tp.partition, tp.offset, e)


def _ensure_snapshot_topic(admin: AdminClient, opts: Options) -> list[int]:
    try:
        topics = admin.list_topics(timeout=opts.timeout_s).topics
    except KafkaException as e:
        raise CompactionError(f"no cluster metadata from {opts.bootstrap_servers} within {opts.timeout_s:.0f}s "
                              f"({e.args[0]})") from e
    if opts.changelog not in topics or topics[opts.changelog].error is not None:
        raise CompactionError(f"changelog topic {opts.changelog!r} does not exist: wrong --app-id, or the pipeline "
                              "never ran")
    partitions = sorted(topics[opts.changelog].partitions)
    if opts.snapshots not in topics:
        future = admin.create_topics([NewTopic(opts.snapshots, len(partitions), -1, config=SNAPSHOT_CONFIG)],
                                     request_timeout=opts.timeout_s)[opts.snapshots]
        try:
            future.result(opts.timeout_s)
        except KafkaException as e:
            if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:
                raise CompactionError(f"cannot create {opts.snapshots!r}: {e.args[0]}") from e
    elif len(topics[opts.snapshots].partitions) != len(partitions):
        raise CompactionError(f"{opts.snapshots!r} has {len(topics[opts.snapshots].partitions)} partitions, the "
                              f"changelog {len(partitions)}: partition p of both must belong together")
    return partitions


def _consumer(opts: Options) -> CheckedConsumer:
    return CheckedConsumer(Consumer({
        **opts.client(),
        "group.id": f"{opts.app_id}.compaction",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
    }))


# -- command line ----------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--changelog-topic", default="", help="default: <app-id>-changelog")
    parser.add_argument("--snapshot-topic", default="", help="default: <app-id>-snapshots")
    parser.add_argument("--master", default=None,
                        help="Spark master for a session built here (default local[*]; ignored under spark-submit)")
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES)
    parser.add_argument("--keep-history", action="store_true",
                        help="do not delete below the previous generation after publishing")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for each Kafka request")
    parser.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka property for the job's own clients (e.g. security.protocol=SSL)")
    parser.add_argument("--spark-kafka", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Java client property for Spark's Kafka source (e.g. sasl.jaas.config=...)")


def options_from(args: argparse.Namespace) -> Options:
    kafka = dict(kv.split("=", 1) for kv in args.kafka)
    spark_kafka = dict(kv.split("=", 1) for kv in args.spark_kafka)
    return Options(args.bootstrap_servers, args.app_id, args.changelog_topic, args.snapshot_topic, args.chunk_bytes,
                   not args.keep_history, args.timeout, kafka, spark_kafka)


def run(args: argparse.Namespace) -> int:
    opts = options_from(args)
    spark = _session(args.master, opts.app_id)
    try:
        report = compact(spark, opts)
    except (CompactionError, KafkaException, TimeoutError) as e:  # EndOffsetsTimeout is a TimeoutError
        print(f"compaction failed: {e}", file=sys.stderr)
        return 1
    print(report.summary(), flush=True)
    return 1 if report.failed else 0


def _session(master: str | None, app_id: str):
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT") and master is None:  # launched by spark-submit: its session
        return SparkSession.builder.appName(f"{app_id}-compaction").getOrCreate()
    from snapshots.spark_session import local_spark_session

    return local_spark_session(f"{app_id}-compaction", master or "local[*]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compact", description="Fold snapshots and changelog into new snapshots")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":  # spark-submit snapshots/compact.py ...: run the installed module, so that executors
    from snapshots.compact import main as installed_main  # unpickle its functions by reference

    sys.exit(installed_main())
