"""Every output carries the coordinates of the input record it came from, so a checker can prove exactly-once."""

from __future__ import annotations

SOURCE_HEADER = "eos.source"


def encode_source(partition: int, offset: int) -> bytes:
    return b"%d:%d" % (partition, offset)


def decode_source(headers: list[tuple[str, bytes]] | None) -> tuple[int, int] | None:
    """(input partition, input offset) from an output's headers, or None if it has none."""
    for name, value in headers or ():
        if name == SOURCE_HEADER:
            partition, offset = value.split(b":")
            return int(partition), int(offset)
    return None
