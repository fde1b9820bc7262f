"""tools/segments.py: a producer epoch's batches in a partition must follow each other by sequence."""

from __future__ import annotations

from pathlib import Path

from tools.segments import CONTROL, HEADER, TRANSACTIONAL, partition_batches, sequence_gaps


def batch(base: int, count: int, pid: int, epoch: int, seq: int, attributes: int = TRANSACTIONAL) -> bytes:
    """A batch header and `count` bytes standing for its records (length counts from the leader epoch on)."""
    length = HEADER.size - 12 + count
    header = HEADER.pack(base, length, 1, 2, 0, attributes, count - 1, 0, 0, pid, epoch, seq, count)
    return header + bytes(count)


def partition(tmp_path: Path, *batches: bytes) -> Path:
    directory = tmp_path / "dlq-0"
    directory.mkdir()
    (directory / "00000000000000000000.log").write_bytes(b"".join(batches))
    return directory


def test_a_partition_that_begins_at_sequence_2_lost_the_producers_first_batch(tmp_path: Path) -> None:
    directory = partition(tmp_path, batch(0, 2, 7, 3, 2), batch(2, 1, 7, 3, 4), batch(3, 1, 7, 3, -1, CONTROL))
    assert [b.base_sequence for b in partition_batches(directory)] == [2, 4, -1]
    (gap,) = sequence_gaps(directory)
    assert "producer 7/3 seq 2" in gap and "sequence 0 expected" in gap


def test_consecutive_sequences_and_a_new_epoch_from_0_are_no_gap(tmp_path: Path) -> None:
    directory = partition(tmp_path, batch(0, 2, 7, 3, 0), batch(2, 3, 7, 3, 2), batch(5, 1, 7, 4, 0))
    assert sequence_gaps(directory) == []
