"""Reads a broker's log segments directly (record batch format v2) and finds batches a producer sent that are missing:
per partition and per (producer id, producer epoch), a first sequence other than 0 or a gap between sequences.

    python -m tools.segments .run/kafka-cluster/node-1/data [--topic chaos-7f149cbe]   sequence gaps, every partition
    python -m tools.segments .run/kafka-cluster/node-1/data/chaos-7f149cbe-dlq-0 --batches   one partition's batches

Why: an idempotent producer numbers its batches per partition, and a committed transaction whose partition shows a gap
lost the batch in between though the client was told it was delivered. This is how the order_fills broker-restart flake
was found (docs/guarantees.md: unknown-commit-retried): the dead-letter partition began at sequence 2 of the
producer's epoch. The broker's files are read as they are (no broker, no consumer): run it on a stopped cluster or
accept that the newest batches may be half written. Batch headers only (compressed batches too); control batches
(transaction markers) carry no sequence and are skipped. A partition whose oldest segments were deleted (retention)
starts mid-sequence: only a log kept from its start says anything.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct(">qiibihiqqqhii")  # base offset .. record count: the 61 bytes before a batch's records
CONTROL = 0x20
TRANSACTIONAL = 0x10


@dataclass(frozen=True)
class Batch:
    base_offset: int
    last_offset: int
    leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    transactional: bool
    control: bool

    def __str__(self) -> str:
        kind = "control" if self.control else ("txn" if self.transactional else "plain")
        return (
            f"@{self.base_offset}-{self.last_offset} leader epoch {self.leader_epoch} producer {self.producer_id}"
            f"/{self.producer_epoch} seq {self.base_sequence} x{self.count} {kind}"
        )


def batches(segment: Path) -> Iterator[Batch]:
    data = segment.read_bytes()
    at = 0
    while at + HEADER.size <= len(data):
        base, length, leader_epoch, _, _, attributes, delta, _, _, pid, pepoch, seq, count = HEADER.unpack_from(
            data, at
        )
        if length <= 0 or at + 12 + length > len(data):
            return  # the end of what was written (a segment is preallocated on some file systems)
        yield Batch(
            base,
            base + delta,
            leader_epoch,
            pid,
            pepoch,
            seq,
            count,
            bool(attributes & TRANSACTIONAL),
            bool(attributes & CONTROL),
        )
        at += 12 + length


def partition_batches(directory: Path) -> Iterator[Batch]:
    for segment in sorted(directory.glob("*.log")):
        yield from batches(segment)


def sequence_gaps(directory: Path) -> list[str]:
    """Every batch whose sequence does not follow its producer epoch's previous one in this partition."""
    found, expected = [], dict[tuple[int, int], int]()
    for batch in partition_batches(directory):
        if batch.control or batch.producer_id < 0 or batch.base_sequence < 0:
            continue
        key = (batch.producer_id, batch.producer_epoch)
        want = expected.get(key, 0)
        if batch.base_sequence != want:
            found.append(f"{directory.name} {batch}: sequence {want} expected")
        expected[key] = batch.base_sequence + batch.count
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.segments", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a broker's data directory, or one partition's directory")
    parser.add_argument("--topic", default="", help="only partitions whose directory name contains this")
    parser.add_argument("--batches", action="store_true", help="list one partition's batches")
    args = parser.parse_args(argv)
    if args.batches:
        for batch in partition_batches(args.path):
            print(batch)
        return 0
    partitions = [d for d in sorted(args.path.iterdir()) if d.is_dir() and args.topic in d.name]
    problems = [gap for d in partitions if not d.name.startswith("__") for gap in sequence_gaps(d)]
    print("\n".join(problems) or f"no sequence gaps in {len(partitions)} partitions")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
