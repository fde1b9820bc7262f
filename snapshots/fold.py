"""Step 2 of a compaction run (Spark): fold each planned partition's base and changelog range, write its chunks.

Spark's Kafka source reads both ranges with kafka.isolation.level=read_committed, explicit startingOffsets/
endingOffsets per partition and failOnDataLoss=true. Each changelog partition is read as one or more Spark partitions
(minPartitions = the cores), each a contiguous offset range read in offset order, so `mapInArrow` folds each piece
with dict updates (last write wins; the offset order is checked, not assumed) down to one row per key with the
offset of its last write, plus the piece's last checkpoint. B's chunks are decoded and CRC-checked the same way, by
the runtime's `ChunkSet`. One shuffle (`groupBy(partition).applyInArrow`) brings B's entries and p's folded changes
together: B is verified against its manifest by the same `ChunkSet` the restore uses -- if it is not valid, the
partition is planned again on the previous snapshot -- then the pieces' last writes are applied in offset order,
tombstones dropped, keys sorted (so chunk boundaries and CRCs are deterministic), and the chunks are written from
that executor by the runtime's `emit_chunks` with an idempotent producer. A partition's state lives in one Python
worker, exactly as it does in the live pipeline. Writing from the executors keeps the data off the driver; a
retried task writes the same chunks again, which readers skip as duplicates by (snapshot id, index).

The functions below the driver's are pickled by Spark and run on the executors: they take plain values (dataclasses
of this module and of pipeline.state, importable there by reference), never the driver's clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any, Literal

from pipeline.state.changelog import CHECKPOINT_KEY
from pipeline.state.snapshot_format import ChunkSet, InvalidSnapshot, Manifest
from pipeline.state.snapshot_writer import WrittenChunks
from snapshots.options import CompactionError, Options
from snapshots.plan import Plan, plan_on_older
from snapshots.report import PartitionReport

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

FOLD_SCHEMA = "partition int, kind int, key string, value binary, ord long, info string"
RESULT_SCHEMA = "partition int, result string"
ENTRY, CHANGE, CHUNK_META, CHANGELOG_META = 0, 1, 2, 3  # the kinds of FOLD_SCHEMA rows
OUT_BATCH_ROWS = 100_000


@dataclass(frozen=True)
class Target:
    """What an executor needs to build partition p's snapshot."""

    snapshot_id: str
    base: Manifest | None


@dataclass
class Folded:
    """An executor's result for one partition: `written` (chunks delivered), `empty` (no committed changelog
    record in the range) or `base_invalid` (B failed verification: `reason`)."""

    status: Literal["written", "empty", "base_invalid"]
    reason: str = ""
    chunks: WrittenChunks | None = None
    input_offset: int | None = None  # the last checkpoint folded in (B's when the range has none)
    input_offsets: dict[str, int | None] | None = None  # that checkpoint's every topic (several inputs), or None
    changelog_records: int = 0
    base_entries: int = 0

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def decode(text: str) -> Folded:
        fields = json.loads(text)
        chunks = fields.pop("chunks")
        return Folded(**fields, chunks=WrittenChunks(**chunks) if chunks else None)


@dataclass
class ChangelogPiece:
    """The meta row of one folded changelog piece (a contiguous offset range of one partition)."""

    records: int = 0
    last_offset: int = -1
    checkpoint_offset: int = -1  # the piece's last checkpoint record, -1: none
    next_input_offset: int | None = None  # what that checkpoint says
    input_offsets: dict[str, int | None] | None = None  # and of every topic, for an App with several inputs


@dataclass
class ChunkMeta:
    """The meta row of one decoded chunk of B, or of one that could not be read (`error`)."""

    index: int = -1
    entries: int = 0
    crc: int = 0
    error: str | None = None


# -- driver --------------------------------------------------------------------------------------------------------
def fold_and_write(
    spark: SparkSession, opts: Options, plans: dict[int, Plan], reports: dict[int, PartitionReport]
) -> dict[int, Folded]:
    """Runs Spark rounds until each planned partition is written or reported; a partition whose base turns out
    invalid is planned again on the previous one (and `plans` updated). Partitions that end without chunks leave
    `plans` for `reports`."""
    # Bigger Arrow batches: fewer Python calls per changelog record (the fold is a few dict updates per batch).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
    written: dict[int, Folded] = {}
    pending = dict(plans)
    while pending:
        results = _spark_round(spark, opts, pending)
        retry: dict[int, Plan] = {}
        for p, plan in pending.items():
            folded = results.get(p, Folded("empty"))
            if folded.status == "written":
                written[p] = folded
                continue
            if folded.status == "empty":
                outcome: Plan | PartitionReport = PartitionReport(
                    p,
                    "skipped",
                    f"no new committed changelog records in [{plan.start}, {plan.end}) (only markers "
                    "or aborted records)",
                )
            elif folded.status == "base_invalid":
                outcome = plan_on_older(opts, plan, folded.reason)
            else:
                raise CompactionError(f"p{p}: unexpected result {folded}")
            if isinstance(outcome, Plan):
                retry[p] = plans[p] = outcome
            else:
                reports[p] = outcome
                plans.pop(p)
        pending = retry
    return written


def _spark_round(spark: SparkSession, opts: Options, plans: dict[int, Plan]) -> dict[int, Folded]:
    # minPartitions splits long changelog ranges over all cores; the fold handles pieces of a partition (each piece
    # is read in offset order, the merge orders the pieces' last writes by offset).
    changelog = _kafka_range(
        spark,
        opts,
        opts.changelog,
        {p: (pl.start, pl.end) for p, pl in plans.items()},
        min_partitions=spark.sparkContext.defaultParallelism,
    )
    changelog = changelog.selectExpr(
        "partition",
        "offset",
        "CAST(key AS STRING) AS key",
        "value",
        f"COALESCE(CAST(key AS STRING) = '{CHECKPOINT_KEY.decode()}' AND "
        "exists(headers, h -> h.key = 'eos.checkpoint'), false) AS is_checkpoint",
    )
    parts = [changelog.mapInArrow(_fold_changelog, FOLD_SCHEMA)]
    # A plan with a base knows its manifest's offset: B's chunks lie below it.
    bases = {
        p: (pl.base, pl.base_offset) for p, pl in plans.items() if pl.base is not None and pl.base_offset is not None
    }
    if bases:
        ranges = {p: (base.first_chunk_offset, offset) for p, (base, offset) in bases.items()}
        chunks = _kafka_range(spark, opts, opts.snapshots, ranges).selectExpr(
            "partition",
            "offset",
            "value",
            "COALESCE(exists(headers, h -> h.key = 'eos.snapshot' AND CAST(h.value AS STRING) = 'chunk'), false) "
            "AS is_chunk",
        )
        parts.append(chunks.mapInArrow(chunk_decoder({p: base for p, (base, _) in bases.items()}), FOLD_SCHEMA))
    rows = reduce(lambda a, b: a.unionByName(b), parts)
    targets = {p: Target(pl.snapshot_id, pl.base) for p, pl in plans.items()}
    writer = _merge_and_write(
        targets, opts.chunk_producer_config(), opts.snapshots, opts.chunk_bytes, opts.chunk_flush_timeout_s
    )
    results = rows.groupBy("partition").applyInArrow(writer, RESULT_SCHEMA).collect()
    return {r.partition: Folded.decode(r.result) for r in results}


def _kafka_range(
    spark: SparkSession, opts: Options, topic: str, ranges: dict[int, tuple[int, int]], min_partitions: int = 0
) -> DataFrame:
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


# -- executors: reading (pickled by Spark: no closures over the driver's clients) ----------------------------------
def _fold_changelog(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One changelog partition in offset order -> one row per key touched (last write and its offset) + one meta row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    folds: dict[int, tuple[dict[str, bytes | None], dict[str, int], ChangelogPiece]] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for p in pc.unique(batch.column("partition")).to_pylist():
            part = batch if _single(batch) else batch.filter(pc.equal(batch.column("partition"), p))
            values, offsets, piece = folds.setdefault(p, ({}, {}, ChangelogPiece()))
            part = _fold_batch(p, part, piece)
            keys = part.column("key").to_pylist()
            values.update(zip(keys, part.column("value").to_pylist(), strict=True))
            offsets.update(zip(keys, part.column("offset").to_pylist(), strict=True))
    for p, (values, offsets, piece) in folds.items():
        keys = list(values)
        for i in range(0, len(keys), OUT_BATCH_ROWS):
            part = keys[i : i + OUT_BATCH_ROWS]
            yield _rows(pa, p, CHANGE, part, [values[k] for k in part], [offsets[k] for k in part])
        yield _rows(pa, p, CHANGELOG_META, [None], [None], [piece.last_offset], [json.dumps(asdict(piece))])


def _fold_batch(p: int, part: pa.RecordBatch, piece: ChangelogPiece) -> pa.RecordBatch:
    """Checks the offset order, counts the records and takes the last checkpoint; the batch's state changes."""
    import numpy as np
    import pyarrow.compute as pc

    from pipeline.state.changelog import Checkpoint

    off = part.column("offset").to_numpy()
    if off[0] <= piece.last_offset or (len(off) > 1 and not bool(np.all(np.diff(off) > 0))):
        raise RuntimeError(f"changelog partition {p}: offsets out of order; the fold needs offset order")
    piece.last_offset = int(off[-1])
    piece.records += part.num_rows
    is_cp = part.column("is_checkpoint")
    if not pc.any(is_cp).as_py():
        return part
    cps = part.filter(is_cp)
    checkpoint = Checkpoint.decode(cps.column("value")[-1].as_py())
    piece.next_input_offset, piece.input_offsets = checkpoint.next_input_offset, dict(checkpoint.offsets) or None
    piece.checkpoint_offset = cps.column("offset")[-1].as_py()
    return part.filter(pc.invert(is_cp))


def _single(batch: pa.RecordBatch) -> bool:
    import pyarrow.compute as pc

    bounds = pc.min_max(batch.column("partition"))
    return bool(bounds["min"].as_py() == bounds["max"].as_py())


def _rows(
    pa: Any,
    p: int,
    kind: int,
    keys: list[Any],
    values: list[Any],
    ords: list[int],
    infos: list[str | None] | None = None,
) -> pa.RecordBatch:
    n = len(keys)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([p] * n, pa.int32()),
            pa.array([kind] * n, pa.int32()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.binary()),
            pa.array(ords, pa.int64()),
            pa.array(infos or [None] * n, pa.string()),
        ],
        names=["partition", "kind", "key", "value", "ord", "info"],
    )


def chunk_decoder(bases: dict[int, Manifest]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """B's chunk records -> their entries + one meta row per chunk, and one per chunk that could not be read."""
        import pyarrow as pa

        found: dict[int, ChunkSet] = {}
        for batch in batches:
            cols = batch.to_pydict()
            for p, offset, value, is_chunk in zip(
                cols["partition"], cols["offset"], cols["value"], cols["is_chunk"], strict=True
            ):
                if not is_chunk:
                    continue
                chunk = found.setdefault(p, ChunkSet(bases[p])).read(value, f"offset {offset}")
                if chunk is None:
                    continue
                for i in range(0, len(chunk.keys), OUT_BATCH_ROWS):
                    keys = chunk.keys[i : i + OUT_BATCH_ROWS]
                    yield _rows(pa, p, ENTRY, keys, chunk.values[i : i + OUT_BATCH_ROWS], [-1] * len(keys))
                meta = ChunkMeta(chunk.index, len(chunk.keys), chunk.crc)
                yield _rows(pa, p, CHUNK_META, [None], [None], [offset], [json.dumps(asdict(meta))])
        for p, chunks in found.items():
            for error in chunks.errors:
                yield _rows(pa, p, CHUNK_META, [None], [None], [-1], [json.dumps(asdict(ChunkMeta(error=error)))])

    return decode


# -- executors: merging and writing -------------------------------------------------------------------------------
def _merge_and_write(
    targets: dict[int, Target], producer_config: dict[str, Any], topic: str, chunk_bytes: int, flush_timeout_s: float
) -> Callable[[pa.Table], pa.Table]:
    def merge(table: pa.Table) -> pa.Table:
        """All rows of one partition -> its chunks written, and one result row."""
        import pyarrow as pa

        p = table.column("partition")[0].as_py()
        folded = merge_partition(table, p, targets[p], producer_config, topic, chunk_bytes, flush_timeout_s)
        return pa.table({"partition": pa.array([p], pa.int32()), "result": [folded.encode()]})

    return merge


def merge_partition(
    table: pa.Table,
    p: int,
    target: Target,
    producer_config: dict[str, Any],
    topic: str,
    chunk_bytes: int,
    flush_timeout_s: float,
) -> Folded:
    import pyarrow.compute as pc
    from confluent_kafka import Producer

    from pipeline.state.snapshot_writer import emit_chunks

    kinds = table.column("kind")
    pieces = [
        ChangelogPiece(**json.loads(x))
        for x in table.filter(pc.equal(kinds, CHANGELOG_META)).column("info").to_pylist()
    ]
    records = sum(piece.records for piece in pieces)
    if records == 0:
        return Folded("empty")
    try:
        entries = base_entries(table, target.base)
    except InvalidSnapshot as e:
        return Folded("base_invalid", reason=str(e))
    in_base = len(entries)
    changes = table.filter(pc.equal(kinds, CHANGE))
    if changes.num_rows:
        changes = changes.take(pc.sort_indices(changes.column("ord")))  # robust even if a partition was split
        entries.update(zip(changes.column("key").to_pylist(), changes.column("value").to_pylist(), strict=True))
    last = max((x for x in pieces if x.checkpoint_offset >= 0), key=lambda x: x.checkpoint_offset, default=None)
    if last is not None:
        input_offset, input_offsets = last.next_input_offset, last.input_offsets
    else:
        input_offset = target.base.input_offset if target.base else None
        input_offsets = target.base.input_offsets if target.base else None
    items = sorted((k, v) for k, v in entries.items() if v is not None)  # tombstones (None) delete
    chunks = emit_chunks(
        Producer(producer_config),
        topic=topic,
        partition=p,
        sid=target.snapshot_id,
        items=items,
        flush_timeout_s=flush_timeout_s,
        chunk_bytes=chunk_bytes,
    )
    return Folded(
        "written",
        chunks=chunks,
        input_offset=input_offset,
        input_offsets=input_offsets,
        changelog_records=records,
        base_entries=in_base,
    )


def base_entries(table: pa.Table, base: Manifest | None) -> dict[str, bytes | None]:
    """B's entries from its decoded chunk rows, verified against its manifest by the runtime's `ChunkSet` (the
    restore's verifier): InvalidSnapshot if a chunk is missing or corrupt, or the counts or checksum disagree."""
    if base is None:
        return {}
    import pyarrow.compute as pc

    kinds = table.column("kind")
    chunks = ChunkSet(base)
    for info in table.filter(pc.equal(kinds, CHUNK_META)).column("info").to_pylist():
        meta = ChunkMeta(**json.loads(info))
        if meta.error is not None:
            chunks.unreadable(meta.error)
        else:
            chunks.add(meta.index, meta.crc, meta.entries)
    rows = table.filter(pc.equal(kinds, ENTRY))
    entries = dict(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    chunks.verify(len(entries))
    return entries
