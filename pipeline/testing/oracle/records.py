"""What a run left behind, as plain data: records detached from any Kafka client, whole topics, one run."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.provenance import decode_source

# (input partition, input offset), and for an App with several inputs (docs/inputs.md) the index of the input when it
# is not the first: (partition, offset, index).
Coord = tuple[int, int] | tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ExpectedOutput:
    """An output as the reference expects it (the App's output serdes applied)."""

    key: bytes | None
    value: bytes | None
    partition: int | None  # None: the app let the producer's partitioner choose, so it is not checked


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as read from a topic, detached from confluent_kafka."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0

    @property
    def coord(self) -> Coord:
        return (self.partition, self.offset)

    @property
    def source(self) -> Coord | None:
        """The input coordinate named by the eos.source header; None if absent or malformed."""
        try:
            return decode_source(self.headers)
        except ValueError:
            return None


@dataclass(frozen=True)
class TopicDump:
    """Every committed record of a topic up to the high watermarks `ends` captured when the drain began."""

    topic: str
    records: list[KafkaRecord]
    ends: dict[int, int]
    exists: bool = True

    @property
    def partitions(self) -> list[int]:
        return sorted(self.ends)


@dataclass(frozen=True)
class RunData:
    """What a run left behind. `changelog` is None for a stateless app; `committed` maps input partition to the
    group's committed offset (None: nothing committed)."""

    input_topic: str
    inputs: TopicDump
    outputs: TopicDump
    dead_letters: TopicDump
    changelog: TopicDump | None
    committed: dict[int, int | None]
    # Several inputs (docs/inputs.md): the other co-partitioned topics (inputs, then tables) in the App's order, their
    # committed offsets (topic -> partition -> offset), and the global tables by name.
    more_inputs: dict[str, TopicDump] = field(default_factory=dict)
    more_committed: dict[str, dict[int, int | None]] = field(default_factory=dict)
    global_tables: dict[str, TopicDump] = field(default_factory=dict)

    def dumps(self) -> list[TopicDump]:
        """Every topic read for this run (the changelog only for a stateful app)."""
        dumps = [self.inputs, *self.more_inputs.values(), *self.global_tables.values(), self.outputs, self.dead_letters]
        return [*dumps, self.changelog] if self.changelog is not None else dumps
