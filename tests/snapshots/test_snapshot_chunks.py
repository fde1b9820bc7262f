"""The one chunk emitter and the one chunk verifier, without a broker: a snapshot written by `emit_chunks` (the
pipeline's writer and the Spark job's executors both use it) is accepted or rejected with the same words by the
restore's `ChunkLoad` and by the compaction job's base check (its executor functions, called here on Arrow batches
without a Spark session), whatever the damage."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from confluent_kafka import KafkaException, Message

from pipeline.state.snapshot_finder import ChunkLoad, InvalidSnapshot
from pipeline.state.snapshot_format import (
    CHUNK_HEADER,
    MANIFEST_HEADER,
    Manifest,
    snapshot_id,
)
from pipeline.state.snapshot_writer import emit_chunks, manifest_for, write_snapshot
from tests.fakes import FakeProducer, FeedConsumer

TOPIC = "app-snapshots"
SID = snapshot_id("app", 0, None, 0, 100)
DAMAGES = ["none", "missing", "bad-crc", "wrong-count", "wrong-checksum", "not-a-chunk", "duplicate", "interleaved"]


def entries(n: int = 300) -> dict[str, bytes]:
    rng = random.Random(n)
    return {f"key-{i}": rng.randbytes(rng.randint(0, 30)) for i in range(n)}


def written_snapshot(damage: str) -> tuple[Manifest, list[Message], int]:
    """A snapshot of `entries()` written by emit_chunks, damaged; its manifest, records and manifest offset."""
    producer = FakeProducer()
    chunks = emit_chunks(
        producer,
        topic=TOPIC,
        partition=0,
        sid=SID,
        items=sorted(entries().items()),
        flush_timeout_s=1,
        chunk_bytes=1_000,
    )
    assert chunks.chunks >= 3
    manifest = manifest_for(
        chunks,
        generation=1,
        partition=0,
        changelog_topic="app-changelog",
        changelog_offset=100,
        input_offset=42,
        previous_id=None,
    )
    records = list(producer.records)
    value = records[1].value()
    if damage == "missing":
        del records[1]
    elif damage == "bad-crc":
        records[1] = _with_value(records[1], value[:-1] + bytes([value[-1] ^ 1]))
    elif damage == "wrong-count":
        manifest = replace(manifest, entries=manifest.entries + 1)
    elif damage == "wrong-checksum":
        manifest = replace(manifest, checksum=manifest.checksum ^ 1)
    elif damage == "not-a-chunk":
        records[1] = _with_value(records[1], b"garbage")
    elif damage == "duplicate":  # a retried Spark task wrote chunk 1 again, after the others
        records.append(_with_value(records[1], value, offset=records[-1].offset() + 1))
    elif damage == "interleaved":  # another run's chunk between this snapshot's
        other = FakeProducer(first_offset=records[-1].offset() + 1)
        emit_chunks(
            other,
            topic=TOPIC,
            partition=0,
            sid=snapshot_id("app", 0, "x", 0, 1),
            items=[("k", b"v")],
            flush_timeout_s=1,
        )
        records.extend(other.records)
    return manifest, records, records[-1].offset() + 1


def _with_value(m: Message, value: bytes, offset: int | None = None) -> Message:
    return Message(
        topic=m.topic(),
        partition=m.partition(),
        offset=m.offset() if offset is None else offset,
        key=m.key(),
        value=value,
        headers=m.headers(),
    )


def restore_load(manifest: Manifest, records: list[Message], manifest_offset: int) -> dict[str, bytes]:
    load = ChunkLoad(FeedConsumer.of(records), TOPIC, 0, manifest_offset, manifest)
    while not load.done:
        load.step(1)
    return load.finish()


def spark_base(manifest: Manifest, records: list[Message]) -> dict[str, bytes]:
    pa = pytest.importorskip("pyarrow")
    from snapshots.fold import base_entries, chunk_decoder

    batch = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0] * len(records), pa.int32()),
            "offset": [m.offset() for m in records],
            "value": [m.value() for m in records],
            "is_chunk": [CHUNK_HEADER in m.headers() for m in records],
        }
    )
    half = len(records) // 2  # two pieces of the partition, as two executors would decode them
    rows = [
        *chunk_decoder({0: manifest})(iter([batch.slice(0, half)])),
        *chunk_decoder({0: manifest})(iter([batch.slice(half)])),
    ]
    return base_entries(pa.Table.from_batches(rows), manifest)


@pytest.mark.parametrize("damage", DAMAGES)
def test_the_restore_and_the_compaction_job_verify_a_snapshot_alike(damage):
    manifest, records, manifest_offset = written_snapshot(damage)
    outcomes = []
    for read in (lambda: restore_load(manifest, records, manifest_offset), lambda: spark_base(manifest, records)):
        try:
            outcomes.append(read())
        except InvalidSnapshot as e:
            outcomes.append(str(e))
    restored, folded = outcomes
    if damage in ("none", "duplicate", "interleaved"):
        assert restored == folded == entries()
    else:
        assert isinstance(restored, str) and restored == folded
        expected = {
            "missing": "1 of",
            "bad-crc": "CRC-32 mismatch",
            "wrong-count": "the manifest says",
            "wrong-checksum": "checksum",
            "not-a-chunk": "not a snapshot chunk",
        }[damage]
        assert expected in restored


def test_emit_chunks_fails_when_a_chunk_is_not_delivered():
    with pytest.raises(KafkaException, match="chunks not delivered"):
        emit_chunks(
            FakeProducer(fail_delivery=True),
            topic=TOPIC,
            partition=0,
            sid=SID,
            items=sorted(entries().items()),
            flush_timeout_s=1,
        )


def test_an_empty_state_has_chunks_only_with_a_place_for_its_manifest():
    chunks = emit_chunks(FakeProducer(), topic=TOPIC, partition=0, sid=SID, items=[], flush_timeout_s=1)
    assert (chunks.chunks, chunks.entries, chunks.first_offset) == (0, 0, None)
    with pytest.raises(ValueError):
        manifest_for(
            chunks,
            generation=1,
            partition=0,
            changelog_topic="c",
            changelog_offset=1,
            input_offset=None,
            previous_id=None,
        )
    manifest = manifest_for(
        chunks,
        generation=1,
        partition=0,
        changelog_topic="c",
        changelog_offset=1,
        input_offset=None,
        previous_id=None,
        first_chunk_offset=7,
    )
    assert manifest.first_chunk_offset == 7 and restore_load(manifest, [], 7) == {}


def test_write_snapshot_writes_chunks_then_the_manifest_that_describes_them():
    producer = FakeProducer()
    state = entries()
    manifest = write_snapshot(
        producer,
        app_id="app",
        snapshot_topic=TOPIC,
        changelog_topic="app-changelog",
        partition=0,
        entries=state.items(),
        changelog_offset=100,
        input_offset=42,
        base=None,
        timeout_s=1,
        chunk_bytes=1_000,
    )
    *chunks, last = producer.records
    assert last.headers() == [MANIFEST_HEADER] and Manifest.decode(last.value()) == manifest
    assert all(m.headers() == [CHUNK_HEADER] for m in chunks) and len(chunks) == manifest.chunks
    assert (manifest.generation, manifest.first_chunk_offset, manifest.entries) == (1, 100, len(state))
    assert restore_load(manifest, chunks, last.offset()) == state
    with pytest.raises(ValueError):
        write_snapshot(
            producer,
            app_id="app",
            snapshot_topic=TOPIC,
            changelog_topic="app-changelog",
            partition=0,
            entries=[],
            changelog_offset=100,
            input_offset=42,
            base=None,
            timeout_s=1,
        )


def test_write_snapshot_from_a_state_view_writes_the_chunks_of_its_sorted_items():
    # A state's items view has its keys sorted (not a list of tuples: the shutdown snapshot's peak memory); the
    # chunks must be the very ones the sorted (key, value) list gives.
    state = dict(reversed(entries().items()))
    written = {}
    for kind, given in (("view", state.items()), ("list", list(state.items()))):
        producer = FakeProducer()
        write_snapshot(
            producer,
            app_id="app",
            snapshot_topic=TOPIC,
            changelog_topic="app-changelog",
            partition=0,
            entries=given,
            changelog_offset=100,
            input_offset=42,
            base=None,
            timeout_s=1,
            chunk_bytes=1_000,
        )
        written[kind] = [(m.key(), m.value()) for m in producer.records[:-1]]
    assert written["view"] == written["list"] and len(written["view"]) > 1
    with pytest.raises(ValueError):
        write_snapshot(
            producer,
            app_id="app",
            snapshot_topic=TOPIC,
            changelog_topic="app-changelog",
            partition=0,
            entries={}.items(),
            changelog_offset=100,
            input_offset=42,
            base=None,
            timeout_s=1,
        )
