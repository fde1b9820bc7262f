"""Writing one full snapshot of a partition from a process that holds its state: chunks, then the manifest, all
in the caller's open transaction (so the snapshot appears whole or not at all).

The live pipeline uses it on clean shutdown (`SNAPSHOT_ON_SHUTDOWN`) with partition p's own transactional producer:
an owner fenced by a newer one cannot publish, and a compaction that started before it sees a newer manifest at
publish time and skips p. The Spark job (snapshots/compact.py) writes the same format from its executors.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException, Producer

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


def write_snapshot(producer: Producer, *, app_id: str, snapshot_topic: str, changelog_topic: str, partition: int,
                   entries: Iterable[tuple[str, bytes]], changelog_offset: int, input_offset: int | None,
                   base: Manifest | None, timeout_s: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Manifest:
    """Produces the snapshot of `entries` (sorted here: chunks are deterministic) covering the changelog below
    `changelog_offset` into the open transaction and returns its manifest. The caller commits. `entries` must not
    be empty (an empty state needs no snapshot: its changelog fold is empty too)."""
    p = partition
    sid = snapshot_id(app_id, p, f"in-process:{base.snapshot_id if base else '-'}",
                      base.changelog_offset if base else 0, changelog_offset)
    first_offset: list[int] = []
    errors: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            errors.append(str(error))
        elif not first_offset:
            first_offset.append(message.offset())

    crcs, count, size = [], 0, 0
    for index, (keys, values) in enumerate(split_chunks(sorted(entries), chunk_bytes)):
        payload, crc = encode_chunk(sid, index, keys, values)
        produce_waiting(producer, snapshot_topic, payload, chunk_key(sid, index), partition=p, headers=[CHUNK_HEADER],
                        on_delivery=delivered)
        crcs.append(crc)
        count += len(keys)
        size += len(payload)
    if not crcs:
        raise ValueError("an empty state has no snapshot to write")
    if producer.flush(timeout_s) or errors:  # the first chunk's offset goes into the manifest
        raise KafkaException(f"snapshot chunks of p{p} not delivered: {errors or 'flush timed out'}")
    manifest = Manifest(
        snapshot_id=sid, generation=(base.generation if base else 0) + 1, partition=p,
        changelog_topic=changelog_topic, changelog_offset=changelog_offset, input_offset=input_offset,
        chunks=len(crcs), entries=count, bytes=size, checksum=manifest_checksum(crcs),
        first_chunk_offset=first_offset[0],
        created_at=now_iso(), previous_id=base.snapshot_id if base else None,
    )
    produce_waiting(producer, snapshot_topic, manifest.encode(), sid.encode(), partition=p, headers=[MANIFEST_HEADER])
    return manifest

