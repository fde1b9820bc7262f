"""What the test driver hands back for each output (pipeline/testing/driver.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

from pipeline.core.provenance import TimerSource


class Produced(NamedTuple):
    """One output, decoded with the App's output serdes."""

    key: Any
    value: Any
    topic: str
    partition: int
    # The input record it came from: (partition, offset), with the input's index for another than the first input
    # (several inputs); None for a timer's.
    source: tuple[int, int] | tuple[int, int, int] | None
    timer: TimerSource | None  # the timer firing it came from; None for a record's
