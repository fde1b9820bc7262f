"""Finding the latest complete snapshot of a partition, in steps that never block for long.

`ManifestScan` reads partition p of the snapshot topic backwards from its end in growing windows (8, 32, 128, ...
records), each window read with read_committed *to its end* by a `TailReader` (the position reaching the window's
end, never a single poll), and collects the manifests it meets, newest first. The end is the last stable offset:
everything above it belongs to a transaction still open, i.e. a publish in flight, which is not a snapshot yet;
with no open transaction it equals the high watermark. Transaction markers, aborted manifests and chunks are
stepped over by the position; an empty partition has no window at all.

`ChunkLoad` reads the chunks of one manifest ([first_chunk_offset, manifest offset)) in steps and verifies them with
`snapshot_format.ChunkSet` (the verifier the compaction job uses too): every index 0..chunks-1 present with a good
CRC, the entry count and the manifest checksum. Chunks of other snapshots that lie in between (an interleaved or
crashed run) are skipped by snapshot id; a duplicate index (a retried Spark task) is read once. Anything else makes
the snapshot invalid (`InvalidSnapshot`), and the caller falls back to an older one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from pipeline.kafka.offsets import OffsetRequest, Reading, TailReader
from pipeline.kafka.records import Consumed
from pipeline.state.snapshot_format import (
    FORMAT_VERSION,
    ChunkSet,
    InvalidSnapshot,
    Manifest,
    is_chunk,
    is_manifest,
)

__all__ = ["ChunkLoad", "InvalidSnapshot", "ManifestScan", "precheck", "scan_all", "snapshot_bounds_request"]
log = logging.getLogger(__name__)
FIRST_WINDOW = 8
WINDOW_GROWTH = 4
CHUNKS_PER_STEP = 8  # a chunk decodes in a few ms: keep each step well inside the restore budget


def snapshot_bounds_request(topic: str, partition: int) -> dict[str, OffsetRequest]:
    """What a scan of partition p needs to know first, asked with ask_offsets: the low watermark and the last stable
    offset (read_committed: a publish in flight is not a snapshot yet)."""
    tp = TopicPartition(topic, partition)
    return {
        "snapshot_low": OffsetRequest(tp, OffsetSpec.earliest()),
        "snapshot_end": OffsetRequest(tp, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED),
    }


class ManifestScan:
    def __init__(
        self,
        consumer: Reading,
        topic: str,
        partition: int,
        low: int,
        end: int,
        on_skip: Callable[[int, str], None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self.partition = partition
        self.low = low
        self.end = end
        self.scanned_from = end  # everything in [scanned_from, end) has been looked at
        self.candidates: list[tuple[int, Manifest]] = []  # found and not handed out yet, newest first
        self.newest_offset: int | None = None  # offset of the newest manifest record, valid or not
        self.records = 0
        self._window = FIRST_WINDOW
        self._reader: TailReader | None = None
        self._found: list[tuple[int, bytes]] = []  # (offset, value) of the manifest records in the window
        self._on_skip = on_skip or (
            lambda offset, why: log.warning("%s[%d]@%d: manifest skipped: %s", topic, partition, offset, why)
        )

    @property
    def exhausted(self) -> bool:
        return not self.candidates and self._reader is None and self.scanned_from <= self.low

    def next_candidate(self) -> tuple[int, Manifest] | None:
        return self.candidates.pop(0) if self.candidates else None

    def step(self, budget_s: float) -> None:
        """Scans until a candidate is available, the start is reached, or the budget is spent."""
        until = time.monotonic() + budget_s
        while not self.candidates and not self.exhausted and time.monotonic() < until:
            if self._reader is None:
                start = max(self.low, self.scanned_from - self._window)
                self._window *= WINDOW_GROWTH
                self._reader = TailReader(
                    self.consumer, self.topic, {self.partition: start}, {self.partition: self.scanned_from}
                )
                self._window_start = start
                self._found = []
            for m in self._reader.step(
                timeout_s=min(0.05, max(0.001, until - time.monotonic())), max_records=CHUNKS_PER_STEP
            ):
                self.records += 1
                if is_manifest(m.headers()):
                    self._found.append((m.offset(), m.value() or b""))  # no value: unreadable, skipped below
            if self._reader.done:
                self._reader = None
                self.scanned_from = self._window_start
                for offset, value in sorted(self._found, reverse=True):
                    if self.newest_offset is None:
                        self.newest_offset = offset
                    try:
                        manifest = Manifest.decode(value)
                    except ValueError as e:
                        self._on_skip(offset, str(e))
                        continue
                    self.candidates.append((offset, manifest))

    def stuck(self) -> str:
        if self._reader is None:
            return "no read pending"
        return ", ".join(f"position {pos} < end {end}" for pos, end in self._reader.stuck().values())


def scan_all(
    consumer: Reading,
    topic: str,
    partition: int,
    low: int,
    end: int,
    timeout_s: float,
    on_skip: Callable[[int, str], None] | None = None,
) -> ManifestScan:
    """Scans the whole partition back to `low` (a few manifests at most: the job keeps two generations)."""
    scan = ManifestScan(consumer, topic, partition, low, end, on_skip)
    found: list[tuple[int, Manifest]] = []
    deadline = time.monotonic() + timeout_s
    while not scan.exhausted:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{topic}[{partition}]: manifest scan did not finish in {timeout_s:.0f}s "
                f"({scan.stuck()}); is a transaction on it stuck open?"
            )
        scan.step(0.5)
        while (candidate := scan.next_candidate()) is not None:
            found.append(candidate)
    scan.candidates = found
    return scan


def precheck(
    manifest: Manifest, partition: int, changelog_topic: str, changelog_end: int, snapshot_low: int = 0
) -> None:
    """What a manifest must say before its chunks are worth reading."""
    if manifest.format != FORMAT_VERSION:
        raise InvalidSnapshot(f"format version {manifest.format}; this reader knows {FORMAT_VERSION}")
    if manifest.partition != partition:
        raise InvalidSnapshot(f"manifest is for partition {manifest.partition}, found in partition {partition}")
    if manifest.changelog_topic != changelog_topic:
        raise InvalidSnapshot(f"manifest covers changelog {manifest.changelog_topic!r}, not {changelog_topic!r}")
    if manifest.first_chunk_offset < snapshot_low:
        raise InvalidSnapshot(
            f"its chunks from offset {manifest.first_chunk_offset} were deleted (the snapshot topic "
            f"starts at {snapshot_low})"
        )
    if manifest.changelog_offset > changelog_end:
        raise InvalidSnapshot(
            f"covers changelog offset {manifest.changelog_offset}, but the changelog ends at {changelog_end} "
            "(was the changelog topic deleted and recreated?)"
        )


class ChunkLoad:
    """Reads and verifies the chunks of one manifest into a dict, in steps."""

    def __init__(self, consumer: Reading, topic: str, partition: int, manifest_offset: int, manifest: Manifest) -> None:
        self.manifest = manifest
        self.manifest_offset = manifest_offset
        self.partition = partition
        self.entries: dict[str, bytes] = {}
        self.records = 0
        self._chunks = ChunkSet(manifest)
        self._reader = TailReader(
            consumer, topic, {partition: manifest.first_chunk_offset}, {partition: manifest_offset}
        )

    @property
    def done(self) -> bool:
        return self._reader.done

    def step(self, budget_s: float) -> None:
        until = time.monotonic() + budget_s
        while not self._reader.done and time.monotonic() < until:
            for m in self._reader.step(
                timeout_s=min(0.05, max(0.001, until - time.monotonic())), max_records=CHUNKS_PER_STEP
            ):
                self.records += 1
                if is_chunk(m.headers()):
                    self._chunk(m)

    def _chunk(self, m: Consumed) -> None:
        # A chunk record without a value is not a chunk: b"" makes it one more unreadable chunk (CorruptChunk).
        chunk = self._chunks.read(m.value() or b"", f"offset {m.offset()}")
        if chunk is not None:
            self.entries.update(zip(chunk.keys, chunk.values, strict=True))

    def finish(self) -> dict[str, bytes]:
        """The snapshot's entries, or InvalidSnapshot saying what is wrong."""
        self._chunks.verify(len(self.entries))
        return self.entries
