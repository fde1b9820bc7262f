"""What a user writes: an `App` naming its topics and a pure function `process(state, record) -> outputs`.

No Kafka object ever reaches user code. `state` is a dict-like view of the input partition's state (keys are
strings, values anything the state serde can encode); `record` is the decoded input; the return value is an
iterable of `Output`s. The runner makes every call atomic: if `process` raises, its state changes are undone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.serde import JSON, STRING, Serde

State = MutableMapping[str, Any]


class Record(NamedTuple):
    """One decoded input record and where it came from. (Named tuples: created once per record, so cheap matters.)"""

    key: Any
    value: Any
    topic: str
    partition: int
    offset: int
    timestamp_ms: int = 0
    headers: Sequence[tuple[str, bytes]] = ()


class Output(NamedTuple):
    """A record to write. `partition=None` lets the producer's partitioner place it by key (murmur2, as Java)."""

    value: Any
    key: Any = None
    topic: str | None = None
    partition: int | None = None
    headers: Sequence[tuple[str, bytes]] = ()


Process = Callable[[State, Record], Iterable[Output]]
# (record count, partitions, seed) -> (partition, key bytes, value bytes): sample input for `pipeline chaos`.
Generate = Callable[[int, int, int], Iterable[tuple[int, bytes, bytes]]]


@dataclass(frozen=True)
class App:
    """A stateful service: its name (also the consumer group and transactional.id prefix), topics and logic."""

    name: str
    input_topic: str
    output_topic: str
    process: Process
    key_serde: Serde = STRING
    value_serde: Serde = JSON
    output_key_serde: Serde = STRING
    output_value_serde: Serde = JSON
    state_serde: Serde = JSON
    stateful: bool = True
    generate: Generate | None = None

    def decode(self, key: bytes | None, value: bytes | None, topic: str, partition: int, offset: int,
               timestamp_ms: int = 0, headers: Sequence[tuple[str, bytes]] | None = None) -> Record:
        """Input bytes -> Record, with this App's serdes: the one place that does it (both sinks, the checker's fold).
        Raises whatever the serde raises: an undecodable record is poison like a failing `process`."""
        return Record(self.key_serde.deserialize(key), self.value_serde.deserialize(value), topic, partition, offset,
                      timestamp_ms, headers or ())

    def with_topics(self, input_topic: str | None = None, output_topic: str | None = None) -> App:
        """A copy reading/writing other topics (tests and the chaos runner use it)."""
        from dataclasses import replace

        return replace(
            self,
            input_topic=input_topic or self.input_topic,
            output_topic=output_topic or self.output_topic,
        )

