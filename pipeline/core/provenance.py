"""Every output carries the coordinates of the input record it came from, so a checker can prove exactly-once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

SOURCE_HEADER = "eos.source"
# The value of a one-input App's: SOURCE_FORMAT % (partition, offset). The Kafka sink's hot loop formats it inline
# (a call per output, ~5 % of the copier's cost per record, measured).
SOURCE_FORMAT = b"%d:%d"


def encode_source(partition: int, offset: int, input_index: int = 0) -> bytes:
    """b"p:offset" for the (first) input; b"p:offset/i" for the i-th co-partitioned topic of an App with several
    inputs (docs/inputs.md): a one-input App's outputs look as they always did."""
    if input_index:
        return b"%d:%d/%d" % (partition, offset, input_index)
    return SOURCE_FORMAT % (partition, offset)


def decode_source(headers: Iterable[tuple[str, bytes]] | None) -> tuple[int, int] | tuple[int, int, int] | None:
    """(input partition, input offset) from an output's headers, (partition, offset, input index) for a record of
    another than the first input; None if it has none."""
    for name, value in headers or ():
        if name == SOURCE_HEADER:
            coordinate, _, index = value.partition(b"/")
            partition, offset = coordinate.split(b":")
            return (int(partition), int(offset), int(index)) if index else (int(partition), int(offset))
    return None


# Outputs of a timer's on_timer carry, instead of eos.source, where and what fired: the input partition, the
# position (the input offset before which it fired: the record that moved stream time past it, or for a wall-clock
# timer the next offset to process), the clock, the time it was due and its key. A checker tells a timer that fired
# twice from one that fired once by these (docs/guarantees.md: timers-exactly-once).
TIMER_HEADER = "eos.timer"


class TimerSource(NamedTuple):
    partition: int
    position: int
    clock: str
    at_ms: int
    key: str


def encode_timer(partition: int, position: int, clock: str, at_ms: int, key: str) -> bytes:
    return b"%d:%d:%s:%d:%s" % (partition, position, clock.encode(), at_ms, key.encode())


def decode_timer(headers: Iterable[tuple[str, bytes]] | None) -> TimerSource | None:
    """The firing an output came from, or None if it has no eos.timer header. ValueError if it is malformed."""
    for name, value in headers or ():
        if name == TIMER_HEADER:
            partition, position, clock, at_ms, key = value.split(b":", 4)
            return TimerSource(int(partition), int(position), clock.decode(), int(at_ms), key.decode())
    return None
