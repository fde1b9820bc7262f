"""Writing full snapshots: the one chunk emitter and manifest builder of the pipeline and the Spark job.

`emit_chunks` produces a state's chunks to partition p of the snapshot topic and waits until every one is delivered
(the first one's offset goes into the manifest); `manifest_for` builds the manifest that describes them and
`produce_manifest` writes it, last. Who calls them decides the transaction:

- `write_snapshot`: the live pipeline on clean shutdown (`SNAPSHOT_ON_SHUTDOWN`), chunks and manifest in one open
  transaction of partition p's own producer, so the snapshot appears whole or not at all: an owner fenced by a newer
  one cannot publish, and a compaction that started before it sees a newer manifest at publish time and skips p.
- the compaction job (snapshots/fold.py, snapshots/publish.py): chunks from the Spark executors with an idempotent
  producer, then all partitions' manifests from the driver in one fenced transaction.
"""

from __future__ import annotations

from _collections_abc import dict_items  # the type of dict.items() (collections.abc does not name it)
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipeline.kafka.clients import produce_waiting
from pipeline.state.snapshot_format import (
    CHUNK_HEADER,
    DEFAULT_CHUNK_BYTES,
    MANIFEST_HEADER,
    Manifest,
    chunk_key,
    encode_chunk,
    manifest_checksum,
    now_iso,
    snapshot_id,
    split_chunks,
)


@dataclass(frozen=True)
class WrittenChunks:
    """What `emit_chunks` wrote: everything a manifest says about its chunks."""

    snapshot_id: str
    chunks: int
    entries: int
    bytes: int  # raw chunk payload bytes
    checksum: int  # CRC-32 over the chunks' CRC-32s
    first_offset: int | None  # offset of the first chunk; None: no chunk (an empty state)


class _Deliveries:
    """Delivery reports of the chunks: their offsets, or what went wrong."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.errors: list[str] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.offsets.append(cast(int, message.offset()))  # a delivered record has its offset


def emit_chunks(
    producer: Producer,
    *,
    topic: str,
    partition: int,
    sid: str,
    items: Iterable[tuple[str, bytes]],
    flush_timeout_s: float,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WrittenChunks:
    """Produces the chunks of `items` (key order: chunk boundaries and CRCs are then deterministic) and waits until
    every one is delivered; KafkaException if one is not."""
    deliveries = _Deliveries()
    crcs: list[int] = []
    entries = size = 0
    for index, (keys, values) in enumerate(split_chunks(items, chunk_bytes)):
        payload, crc = encode_chunk(sid, index, keys, values)
        produce_waiting(
            producer,
            topic,
            payload,
            chunk_key(sid, index),
            partition=partition,
            headers=[CHUNK_HEADER],
            on_delivery=deliveries,
        )
        producer.poll(0)  # serves delivery reports as they come: they hold the producer's queue until served
        crcs.append(crc)
        entries += len(keys)
        size += len(payload)
    undelivered = producer.flush(flush_timeout_s) if crcs else 0
    if undelivered or deliveries.errors or len(deliveries.offsets) != len(crcs):
        raise KafkaException(
            f"snapshot {sid} p{partition}: chunks not delivered ({undelivered} still queued, "
            f"{len(deliveries.offsets)} of {len(crcs)} delivered; {deliveries.errors[:3]})"
        )
    return WrittenChunks(sid, len(crcs), entries, size, manifest_checksum(crcs), min(deliveries.offsets, default=None))


def manifest_for(
    chunks: WrittenChunks,
    *,
    generation: int,
    partition: int,
    changelog_topic: str,
    changelog_offset: int,
    input_offset: int | None,
    previous_id: str | None,
    changelog_records: int = 0,
    first_chunk_offset: int | None = None,
    input_offsets: Mapping[str, int | None] | None = None,
) -> Manifest:
    """The manifest of `chunks`. `first_chunk_offset` places a manifest without chunks (an empty state)."""
    first = chunks.first_offset if chunks.first_offset is not None else first_chunk_offset
    if first is None:
        raise ValueError(f"snapshot {chunks.snapshot_id} has no chunk: say where its manifest goes")
    return Manifest(
        snapshot_id=chunks.snapshot_id,
        generation=generation,
        partition=partition,
        changelog_topic=changelog_topic,
        changelog_offset=changelog_offset,
        input_offset=input_offset,
        chunks=chunks.chunks,
        entries=chunks.entries,
        bytes=chunks.bytes,
        checksum=chunks.checksum,
        first_chunk_offset=first,
        created_at=now_iso(),
        previous_id=previous_id,
        changelog_records=changelog_records,
        input_offsets=dict(input_offsets) if input_offsets is not None else None,
    )


def produce_manifest(producer: Producer, topic: str, manifest: Manifest) -> None:
    """The manifest record, after its chunks are delivered, into the caller's open transaction."""
    produce_waiting(
        producer,
        topic,
        manifest.encode(),
        manifest.snapshot_id.encode(),
        partition=manifest.partition,
        headers=[MANIFEST_HEADER],
    )


def write_snapshot(
    producer: Producer,
    *,
    app_id: str,
    snapshot_topic: str,
    changelog_topic: str,
    partition: int,
    entries: Iterable[tuple[str, bytes]],
    changelog_offset: int,
    input_offset: int | None,
    base: Manifest | None,
    timeout_s: float,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    input_offsets: Mapping[str, int | None] | None = None,
) -> Manifest:
    """Produces the snapshot of `entries` (sorted here: chunks are deterministic) covering the changelog below
    `changelog_offset` into the open transaction and returns its manifest. The caller commits. `entries` must not
    be empty (an empty state needs no snapshot: its changelog fold is empty too)."""
    if isinstance(entries, dict_items):  # a state's own view (PartitionState.encoded_items): its keys are sorted,
        # 8 bytes each, not a list of (key, value) tuples (72 bytes each: +650 MB at shutdown for 9 M keys)
        mapping = entries.mapping
        keys = sorted(mapping)
        items: Iterable[tuple[str, bytes]] = zip(keys, map(mapping.__getitem__, keys), strict=True)
    else:
        keys = items = sorted(entries)
    if not keys:
        raise ValueError("an empty state has no snapshot to write")
    sid = snapshot_id(
        app_id,
        partition,
        f"in-process:{base.snapshot_id if base else '-'}",
        base.changelog_offset if base else 0,
        changelog_offset,
    )
    chunks = emit_chunks(
        producer,
        topic=snapshot_topic,
        partition=partition,
        sid=sid,
        items=items,
        flush_timeout_s=timeout_s,
        chunk_bytes=chunk_bytes,
    )
    manifest = manifest_for(
        chunks,
        generation=(base.generation if base else 0) + 1,
        partition=partition,
        changelog_topic=changelog_topic,
        changelog_offset=changelog_offset,
        input_offset=input_offset,
        previous_id=base.snapshot_id if base else None,
        input_offsets=input_offsets,
    )
    produce_manifest(producer, snapshot_topic, manifest)
    return manifest
