"""Writing changelogs on purpose (transactions, aborts, checkpoints) and restoring one partition in-process."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.offsets import high_watermarks
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG
from pipeline.state import PartitionState
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.state.restore import ChangelogRestore
from pipeline.state.snapshot_format import (
    CHUNK_HEADER,
    MANIFEST_HEADER,
    Manifest,
    chunk_key,
    encode_chunk,
    manifest_checksum,
    now_iso,
    snapshot_id,
    split_chunks,
)
from snapshots.compact import Options

INPUT = "input-topic"


@dataclass
class Changelog:
    """An app's changelog written directly, like the pipeline writes it: changes + checkpoint per transaction."""

    bootstrap: str
    app_id: str
    partitions: int
    folds: dict[int, dict[str, bytes]] = field(default_factory=dict)
    next_input: dict[int, int] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)  # committed data records (changes + checkpoints)

    def __post_init__(self) -> None:
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": f"{self.app_id}.writer", "linger.ms": 5}
        )
        self.producer.init_transactions(30)
        for p in range(self.partitions):
            self.folds.setdefault(p, {})
            self.next_input.setdefault(p, 0)
            self.records.setdefault(p, 0)

    @property
    def topic(self) -> str:
        return f"{self.app_id}-changelog"

    @property
    def snapshots(self) -> str:
        return f"{self.app_id}-snapshots"

    def transaction(self, p: int, changes: dict[str, bytes | None], commit: bool = True) -> None:
        self.producer.begin_transaction()
        for key, value in changes.items():
            self.producer.produce(self.topic, value, key.encode(), partition=p)
        next_input = self.next_input[p] + max(1, len(changes))
        checkpoint = Checkpoint(INPUT, p, next_input)
        self.producer.produce(self.topic, checkpoint.encode(), CHECKPOINT_KEY, partition=p, headers=[CHECKPOINT_HEADER])
        if not commit:
            self.producer.flush(30)  # the aborted records really reach the log
            self.producer.abort_transaction(30)
            return
        self.producer.commit_transaction(30)
        self.next_input[p] = next_input
        self.records[p] += len(changes) + 1
        fold = self.folds[p]
        for key, value in changes.items():
            if value is None:
                fold.pop(key, None)
            else:
                fold[key] = value

    def random_history(
        self,
        rng: random.Random,
        transactions: int,
        keys: int,
        size: int = 20,
        delete_ratio: float = 0.2,
        abort_ratio: float = 0.1,
        only: list[int] | None = None,
    ) -> None:
        for _ in range(transactions):
            p = rng.choice(only) if only else rng.randrange(self.partitions)
            changes: dict[str, bytes | None] = {}
            for _ in range(rng.randint(1, size)):
                key = f"k{rng.randrange(keys)}-é" if rng.random() < 0.1 else f"k{rng.randrange(keys)}"
                changes[key] = None if rng.random() < delete_ratio else rng.randbytes(rng.randint(0, 40))
            self.transaction(p, changes, commit=rng.random() >= abort_ratio)

    def committed(self, p: int) -> int | None:
        return self.next_input[p] if self.records[p] else None


def create_app_topics(admin: AdminClient, app_id: str, partitions: int) -> None:
    topics = [
        NewTopic(f"{app_id}-changelog", partitions, 1, config=CHANGELOG_CONFIG),
        NewTopic(f"{app_id}-snapshots", partitions, 1, config=SNAPSHOT_CONFIG),
    ]
    for future in admin.create_topics(topics).values():
        future.result(30)


def new_app(admin: AdminClient, bootstrap: str, partitions: int = 2, prefix: str = "snap") -> Changelog:
    app_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_app_topics(admin, app_id, partitions)
    return Changelog(bootstrap, app_id, partitions)


def options(log: Changelog, **overrides) -> Options:
    return Options(log.bootstrap, log.app_id, timeout_s=30, **overrides)


def restore_job(bootstrap: str, app_id: str, p: int, committed: int | None, timeout_s: float = 60) -> ChangelogRestore:
    """A restore of partition p as the runner creates it (its consumer configuration included)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def consumer() -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{app_id}.restore",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "fetch.wait.max.ms": 10,
            }
        )

    return ChangelogRestore(
        consumer,
        admin,
        f"{app_id}-changelog",
        p,
        PartitionState(),
        committed,
        timeout_s,
        10,
        snapshot_topic=f"{app_id}-snapshots",
    )


def bounds_known(job: ChangelogRestore, timeout_s: float = 30) -> None:
    """Until the broker answered the restore's set-up (asked without waiting), without stepping it further."""
    deadline = time.monotonic() + timeout_s
    while not job.offsets_known:
        assert time.monotonic() < deadline, job.stuck()
        time.sleep(0.01)


def run_to_end(job: ChangelogRestore, timeout_s: float = 60) -> dict[str, bytes]:
    """Steps of 200 ms, like the runner's, until done; the encoded state."""
    deadline = time.monotonic() + timeout_s
    while not job.step(0.2):
        assert time.monotonic() < deadline
    return dict(job.state.encoded_items())


def restore(
    bootstrap: str, app_id: str, p: int, committed: int | None, timeout_s: float = 60
) -> tuple[dict[str, bytes], ChangelogRestore]:
    """Restores partition p like the runner does and returns the encoded state."""
    job = restore_job(bootstrap, app_id, p, committed, timeout_s)
    try:
        return run_to_end(job, timeout_s), job
    finally:
        job.close()


def publish_snapshot(
    log: Changelog,
    p: int,
    entries: dict[str, bytes],
    *,
    changelog_offset: int,
    input_offset: int | None,
    generation: int,
    damage: str | None = None,
    chunk_bytes: int = 2_000,
) -> tuple[Manifest, int]:
    """Writes a snapshot of p by hand, like the job does (chunks, then the manifest in a transaction), optionally
    damaged: "flip" garbles a byte of chunk 1, "drop" leaves chunk 1 out, "checksum" and "count" publish a manifest
    whose checksum or entry count disagrees with good chunks, "no-manifest" aborts the manifest's transaction, "half"
    writes only the first chunks and no manifest. Returns the manifest and its offset (or -1)."""
    sid = snapshot_id(log.app_id, p, f"hand-{generation}", 0, changelog_offset)
    chunks = [
        encode_chunk(sid, i, keys, values)
        for i, (keys, values) in enumerate(split_chunks(sorted(entries.items()), chunk_bytes))
    ]
    assert damage is None or len(chunks) >= 3, "damage needs at least 3 chunks"
    offsets: list[int] = []
    plain = Producer({"bootstrap.servers": log.bootstrap, "enable.idempotence": True})
    for i, (payload, _) in enumerate(chunks):
        if (damage == "drop" and i == 1) or (damage == "half" and i >= 2):
            continue
        if damage == "flip" and i == 1:
            payload = payload[:-1] + bytes([payload[-1] ^ 0xFF])
        plain.produce(
            log.snapshots,
            payload,
            chunk_key(sid, i),
            partition=p,
            headers=[CHUNK_HEADER],
            on_delivery=lambda err, msg: offsets.append(msg.offset()),
        )
    assert plain.flush(30) == 0
    manifest = Manifest(
        sid,
        generation,
        p,
        log.topic,
        changelog_offset,
        input_offset,
        len(chunks),
        len(entries) + (damage == "count"),
        sum(len(c) for c, _ in chunks),
        manifest_checksum([crc for _, crc in chunks]) ^ (damage == "checksum"),
        min(offsets),
        now_iso(),
    )
    if damage == "half":
        return manifest, -1
    publisher = Producer({"bootstrap.servers": log.bootstrap, "transactional.id": f"{log.app_id}.hand"})
    publisher.init_transactions(30)
    publisher.begin_transaction()
    where: list[int] = []
    publisher.produce(
        log.snapshots,
        manifest.encode(),
        sid.encode(),
        partition=p,
        headers=[MANIFEST_HEADER],
        on_delivery=lambda err, msg: where.append(msg.offset()),
    )
    publisher.flush(30)
    if damage == "no-manifest":
        publisher.abort_transaction(30)
        return manifest, -1
    publisher.commit_transaction(30)
    return manifest, where[0]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return high_watermarks(admin, topic, list(range(partitions)), 10)
