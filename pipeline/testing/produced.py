"""What the test driver hands a test for each output: the record decoded with the App's output serdes, and where it
came from (pipeline/core/provenance.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

from pipeline.app import App
from pipeline.core.provenance import TimerSource, decode_source, decode_timer
from pipeline.testing.oracle.records import KafkaRecord


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


def decoded(app: App, topic: str, record: KafkaRecord) -> Produced:
    headers = list(record.headers)
    return Produced(
        app.output_key_serde.deserialize(record.key),
        app.output_value_serde.deserialize(record.value),
        topic,
        record.partition,
        decode_source(headers),
        decode_timer(headers),
    )
