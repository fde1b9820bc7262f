"""What a user writes: an `App` naming its topics and a pure function `process(state, record) -> outputs`.

No Kafka object ever reaches user code. `state` is a dict-like view of the input partition's state (keys are
strings, values anything the state serde can encode); `record` is the decoded input; the return value is an
iterable of `Output`s. The runner makes every call atomic: if `process` raises, its state changes are undone.

Time (optional): an App with `on_timer` may schedule timers from `process` through `state.timers`
(pipeline/state/timed.py): `state.timers.schedule(key, at_ms, payload=None, clock="stream")`. When one is due,
`on_timer(state, timer) -> outputs` runs, exactly once in committed output (docs/guarantees.md: timers-exactly-once).
`state_ttl_ms` expires keys not written for that long. `raise Reject("late", "...")` in `process` sends the record
to the dead-letter topic at once, with that error type, instead of retrying it.
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


class Timer(NamedTuple):
    """A due timer, as `on_timer` receives it. `clock` is "stream" (the input partition's stream time: the largest
    record timestamp seen) or "wall" (wall-clock milliseconds since the epoch)."""

    key: str
    at_ms: int
    payload: Any = None
    clock: str = "stream"


class Reject(Exception):
    """Raised by `process`: this record goes to the dead-letter topic now, with `error_type` (e.g. "late"), in the
    transaction that moves past it. Final: never retried, also with ON_POISON=stop. Its state changes are undone."""

    def __init__(self, error_type: str, message: str = "") -> None:
        super().__init__(message or error_type)
        self.error_type = error_type


class Output(NamedTuple):
    """A record to write. `partition=None` lets the producer's partitioner place it by key (murmur2, as Java)."""

    value: Any
    key: Any = None
    topic: str | None = None
    partition: int | None = None
    headers: Sequence[tuple[str, bytes]] = ()


Process = Callable[[State, Record], Iterable[Output]]
OnTimer = Callable[[State, Timer], Iterable[Output]]
Migrate = Callable[[int, Any], Any]  # (the version a state value was written at, the value) -> the current value
# (record count, partitions, seed) -> (partition, key bytes, value bytes[, timestamp ms]): sample input for
# `pipeline chaos`. Without a timestamp the broker stamps the record when it arrives.
Generate = Callable[[int, int, int], Iterable[tuple[int, bytes, bytes] | tuple[int, bytes, bytes, int]]]
CLOCKS = ("stream", "wall")


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
    on_timer: OnTimer | None = None  # called for each due timer scheduled through state.timers
    state_ttl_ms: int | None = None  # keys not written for this long (on state_ttl_clock) are deleted
    state_ttl_clock: str = "stream"
    state_version: int = 1  # the shape of the state values; raise it when it changes, with a migrate
    migrate: Migrate | None = None  # (version the value was written at, value) -> the value at state_version

    def __post_init__(self) -> None:
        if self.state_ttl_clock not in CLOCKS:
            raise ValueError(f"state_ttl_clock must be one of {CLOCKS}, not {self.state_ttl_clock!r}")
        if self.state_ttl_ms is not None and self.state_ttl_ms <= 0:
            raise ValueError(f"state_ttl_ms must be positive, not {self.state_ttl_ms}")
        if self.extended_state and not self.stateful:
            raise ValueError("timers, state TTL and state versions live in the state: a stateless App has none")
        if self.state_version < 1:
            raise ValueError(f"state_version starts at 1, not {self.state_version}")

    @property
    def timed(self) -> bool:
        """Whether this App uses timers or state TTL."""
        return self.on_timer is not None or self.state_ttl_ms is not None

    @property
    def extended_state(self) -> bool:
        """Whether its state is a TimedState (pipeline/state/timed.py): timers, TTL or a state version above 1."""
        return self.timed or self.state_version > 1

    def decode(
        self,
        key: bytes | None,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int = 0,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Record:
        """Input bytes -> Record, with this App's serdes: the one place that does it (both sinks, the checker's fold).
        Raises whatever the serde raises: an undecodable record is poison like a failing `process`."""
        return Record(
            self.key_serde.deserialize(key),
            self.value_serde.deserialize(value),
            topic,
            partition,
            offset,
            timestamp_ms,
            headers or (),
        )

    def with_topics(self, input_topic: str | None = None, output_topic: str | None = None) -> App:
        """A copy reading/writing other topics (tests and the chaos runner use it)."""
        from dataclasses import replace

        return replace(
            self,
            input_topic=input_topic or self.input_topic,
            output_topic=output_topic or self.output_topic,
        )
