"""What a user writes: an `App` naming its topics and a pure function `process(state, record) -> outputs`.

No Kafka object ever reaches user code. `state` is a dict-like view of the input partition's state (keys are
strings, values anything the state serde can encode); `record` is the decoded input; the return value is an
iterable of `Output`s. The runner makes every call atomic: if `process` raises, its state changes are undone.

Time (optional): an App with `on_timer` may schedule timers from `process` through `state.timers`
(pipeline/state/timed.py): `state.timers.schedule(key, at_ms, payload=None, clock="stream")`. When one is due,
`on_timer(state, timer) -> outputs` runs, exactly once in committed output (docs/guarantees.md: timers-exactly-once).
`state_ttl_ms` expires keys not written for that long. `raise Reject("late", "...")` in `process` sends the record
to the dead-letter topic at once, with that error type, instead of retrying it.

Several inputs (docs/inputs.md): `inputs=[Stream(...), ...]` lists co-partitioned input streams (the same partition
count; partition p of each is processed by one task, with one state, in timestamp order); `record.topic` says where
a record came from. `tables={"name": Table(...)}` are compacted topics co-partitioned with the inputs, and
`global_tables={"name": Table(...)}` compacted topics every instance holds whole; `process` reads both through
`state.tables["name"]` (read-only: key -> latest value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from pipeline.serde import JSON, STRING, Serde


class StateTimers(Protocol):
    """`state.timers` of an App with `on_timer` or `state_ttl_ms` (pipeline/state/timed.py implements it)."""

    def schedule(self, key: str, at_ms: int, payload: Any = None, clock: str = "stream") -> None: ...

    def cancel(self, key: str, clock: str = "stream") -> bool: ...

    def get(self, key: str, clock: str = "stream") -> Timer | None: ...

    def __iter__(self) -> Iterator[Timer]: ...  # every pending timer, in firing order per clock

    @property
    def stream_time_ms(self) -> int | None: ...

    @property
    def wall_time_ms(self) -> int: ...


class State(MutableMapping[str, Any]):
    """What `process` gets as `state`: the input partition's state, str keys to values the App's state serde encodes,
    and `tables`, the App's tables by name (`state.tables["accounts"].get(key)`: read-only, key -> latest value)."""

    tables: Mapping[str, Mapping[Any, Any]]

    @property
    def timers(self) -> StateTimers:
        """This partition's timers: only in the state of an App with on_timer or state_ttl_ms (App.timed)."""
        raise NotImplementedError


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


class CodeError(Exception):
    """A mistake in the App's code that fails every record (or timer) the same way: `process` returning None, a
    timer scheduled by an App without `on_timer`. Never retried or dead-lettered: the partition stops at once, with
    an ERROR naming the function, where, and the fix (docs/guarantees.md: fail-fast)."""

    def __init__(self, function: str, problem: str, fix: str) -> None:
        super().__init__(f"{function} {problem}")
        self.function, self.problem, self.fix = function, problem, fix


OUTPUTS_FIX = "return a list of Output (or yield them), [] for none; Output(value=..., key=...) by name"


def checked_outputs(function: str, result: Any) -> list[Output]:
    """What `process` or `on_timer` returned, as a list of Outputs; CodeError for anything else. Errors raised by a
    generator's own body pass through: they are the record's failure, not a wrong return type."""
    if result is None or isinstance(result, (Output, str, bytes, Mapping)) or not isinstance(result, Iterable):
        what = "a single Output" if isinstance(result, Output) else repr(result)[:80]
        raise CodeError(function, f"returned {what}, not an iterable of Outputs", OUTPUTS_FIX)
    outputs = list(result)
    for output in outputs:
        if not isinstance(output, Output):
            got = f"{type(output).__name__} {output!r:.80}"
            raise CodeError(function, f"returned a {got} among its outputs, not an Output", OUTPUTS_FIX)
    return outputs


class _DeadLetters:
    """The topic of an output that dead-letters a record held earlier (`dead_letter`)."""

    def __repr__(self) -> str:
        return "DEAD_LETTERS"


DEAD_LETTERS: Any = _DeadLetters()
HELD_HEADER = "eos.held"  # on such an output: where the held record came from and why it is dead-lettered


def dead_letter(record: Record, error_type: str, message: str = "") -> Output:
    """An output that sends `record` to the dead-letter topic, with `error_type`, in this transaction: a record that
    `process` received earlier and held in its state, not the one it is processing now (raise Reject for that). E.g.
    a fill that waited for its order and turns out to overfill it. Keep the held record in state as its fields
    (`list(record)`; `Record(*fields)` gives it back); its key and value are written with its input's serdes."""
    where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    meta = JSON.serialize({**where, "error_type": error_type, "message": message or error_type})
    return Output(value=record.value, key=record.key, topic=DEAD_LETTERS, headers=((HELD_HEADER, meta or b""),))


Process = Callable[[State, Record], Iterable[Output]]
OnTimer = Callable[[State, Timer], Iterable[Output]]
Migrate = Callable[[int, Any], Any]  # (the version a state value was written at, the value) -> the current value
# (record count, partitions, seed) -> (partition, key bytes, value bytes[, timestamp ms]): sample input for
# `pipeline chaos`. Without a timestamp the broker stamps the record when it arrives. An App with several inputs or
# tables names the topic of each: (topic, partition, key bytes, value bytes or None, timestamp ms).
Generated = tuple[int, bytes, bytes] | tuple[int, bytes, bytes, int] | tuple[str, int, bytes, bytes | None, int]
Generate = Callable[[int, int, int], Iterable[Generated]]
CLOCKS = ("stream", "wall")


@dataclass(frozen=True)
class Stream:
    """An input stream: a topic whose records `process` gets one at a time, decoded with these serdes. `record.topic`
    is the topic's name as the App declares it, also where TOPIC_SUFFIX renamed it (`name`)."""

    topic: str
    key_serde: Serde = STRING
    value_serde: Serde = JSON
    name: str = ""  # the topic as the App declares it (default: `topic`); what `record.topic` says

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.topic)


@dataclass(frozen=True)
class Table:
    """A compacted topic read as a table: key -> the latest value, a record without a value deleting its key. In
    `App.tables`, co-partitioned with the inputs (partition p of the table beside partition p of the inputs, updated
    in timestamp order with them, restored with the task's state); in `App.global_tables`, every partition in every
    instance (reference data: read-only, restored before any task processes, kept up to date while running)."""

    topic: str
    key_serde: Serde = STRING
    value_serde: Serde = JSON


def _missing_process(state: State, record: Record) -> Iterable[Output]:
    raise TypeError("this App has no process function")


@dataclass(frozen=True)
class App:
    """A stateful service: its name (also the consumer group and transactional.id prefix), topics and logic."""

    name: str
    input_topic: str = ""  # the input topic of a one-input App; with `inputs`, the first of them
    output_topic: str = ""
    process: Process = _missing_process
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
    # TTL deadlines rounded up to a multiple of this (0: exact): a key may live up to this much longer, and its
    # deadline entry is written again only when a write moves it to a later multiple (docs/guarantees.md).
    state_ttl_granularity_ms: int = 0
    state_version: int = 1  # the shape of the state values; raise it when it changes, with a migrate
    migrate: Migrate | None = None  # (version the value was written at, value) -> the value at state_version
    # Several co-partitioned input streams (a topic name means a Stream with this App's key and value serdes).
    # Checks of the App's own properties over a finished run (pipeline verify, chaos, the driver's verify): called
    # with the run's pipeline.testing.oracle.RunData, returns problems ("where: what"). Optional.
    check: Callable[[Any], Iterable[str]] | None = None
    inputs: Sequence[Stream | str] = ()
    tables: Mapping[str, Table | str] = field(default_factory=dict)  # co-partitioned tables, by name
    global_tables: Mapping[str, Table | str] = field(default_factory=dict)  # tables every instance holds whole
    # What __post_init__ makes of inputs and tables: Streams and Tables (`streams`, `table_specs`, ...).
    _streams: tuple[Stream, ...] = field(init=False, repr=False, compare=False, default=())
    _table_specs: Mapping[str, Table] = field(init=False, repr=False, compare=False, default_factory=dict)
    _global_table_specs: Mapping[str, Table] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        from pipeline.app_checks import check_app, check_topics  # which imports this module

        check_app(self)
        self._normalise_inputs()
        check_topics(self)
        if self.state_ttl_clock not in CLOCKS:
            raise ValueError(f"state_ttl_clock must be one of {CLOCKS}, not {self.state_ttl_clock!r}")
        if self.state_ttl_ms is not None and self.state_ttl_ms <= 0:
            raise ValueError(f"state_ttl_ms must be positive, not {self.state_ttl_ms}")
        if self.state_ttl_granularity_ms < 0 or (self.state_ttl_granularity_ms and self.state_ttl_ms is None):
            raise ValueError(
                f"state_ttl_granularity_ms must be >= 0 and needs state_ttl_ms, not {self.state_ttl_granularity_ms}"
            )
        if self.extended_state and not self.stateful:
            raise ValueError("timers, state TTL and state versions live in the state: a stateless App has none")
        if self.tables and not self.stateful:
            raise ValueError(f"App {self.name!r}: co-partitioned tables are restored with the state: stateful=True")
        if self.state_version < 1:
            raise ValueError(f"state_version starts at 1, not {self.state_version}")

    def _normalise_inputs(self) -> None:
        """`streams` are the inputs as Streams (one, built from input_topic, for a one-input App) and input_topic
        their first topic; tables become Tables. `inputs` itself stays as given, so that replace(app, input_topic=...)
        renames the input of a one-input App."""
        if self.process is _missing_process:
            raise ValueError(f"App {self.name!r}: process is missing: App(name, input_topic, output_topic, process)")
        given = self.inputs or ((self.input_topic,) if self.input_topic else ())
        streams = tuple(Stream(s, self.key_serde, self.value_serde) if isinstance(s, str) else s for s in given)
        if not streams:
            raise ValueError(f"App {self.name!r}: no input topic (input_topic, or inputs for several)")
        if self.input_topic and self.input_topic != streams[0].topic:
            raise ValueError(
                f"App {self.name!r}: input_topic {self.input_topic!r} is not the first of inputs "
                f"{[s.topic for s in streams]}: give one or the other"
            )
        tables = {name: Table(t) if isinstance(t, str) else t for name, t in self.tables.items()}
        global_tables = {name: Table(t) if isinstance(t, str) else t for name, t in self.global_tables.items()}
        if clash := tables.keys() & global_tables.keys():
            raise ValueError(f"App {self.name!r}: table names {sorted(clash)} are both co-partitioned and global")
        topics = [s.topic for s in streams] + [t.topic for t in (*tables.values(), *global_tables.values())]
        if len(set(topics)) != len(topics):
            raise ValueError(f"App {self.name!r}: a topic is named twice among inputs and tables: {topics}")
        object.__setattr__(self, "_streams", streams)
        object.__setattr__(self, "input_topic", streams[0].topic)
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "global_tables", global_tables)
        object.__setattr__(self, "_table_specs", tables)
        object.__setattr__(self, "_global_table_specs", global_tables)

    @property
    def streams(self) -> tuple[Stream, ...]:
        """The input streams, the first one's partitions assigned by the group (the others' go with them)."""
        return self._streams

    @property
    def co_partitioned(self) -> tuple[str, ...]:
        """Every topic a task reads partition p of: the input streams, then the co-partitioned tables."""
        return (*(s.topic for s in self.streams), *(t.topic for t in self.table_specs.values()))

    @property
    def table_specs(self) -> Mapping[str, Table]:
        return self._table_specs

    @property
    def global_table_specs(self) -> Mapping[str, Table]:
        return self._global_table_specs

    @property
    def multi_input(self) -> bool:
        """Whether a task merges several co-partitioned topics (inputs or tables) by timestamp."""
        return len(self.co_partitioned) > 1

    def stream(self, topic: str) -> Stream:
        """The input stream read from `topic`, or declared as `topic` (KeyError for any other topic)."""
        for s in self.streams:
            if s.topic == topic:
                return s
        for s in self.streams:
            if s.name == topic:
                return s
        raise KeyError(topic)

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
        """Input bytes -> Record, with the serdes of `topic`'s stream: the one place that does it (both sinks, the
        checker's fold). Raises whatever the serde raises: an undecodable record is poison like a failing `process`."""
        stream = self.streams[0] if len(self.streams) == 1 else self.stream(topic)
        return Record(
            stream.key_serde.deserialize(key),
            stream.value_serde.deserialize(value),
            stream.name,
            partition,
            offset,
            timestamp_ms,
            headers or (),
        )

    def with_topics(self, input_topic: str | None = None, output_topic: str | None = None) -> App:
        """A copy reading its (first) input from and writing to other topics (tests and the chaos runner use it)."""
        first = replace(self.streams[0], topic=input_topic or self.input_topic, name=self.streams[0].name)
        return replace(
            self, input_topic="", inputs=(first, *self.streams[1:]), output_topic=output_topic or self.output_topic
        )

    def configured(self, topic_suffix: str = "", input_topic: str = "", output_topic: str = "") -> App:
        """This App with the topic settings applied (TOPIC_SUFFIX, INPUT_TOPIC, OUTPUT_TOPIC): what `pipeline run`,
        `verify`, `chaos` and `acls` all work with. INPUT_TOPIC renames the input of a one-input App only."""
        if input_topic and len(self.co_partitioned) > 1:
            raise ValueError(
                f"INPUT_TOPIC={input_topic!r}: App {self.name!r} reads {list(self.co_partitioned)}; rename them in the "
                "App, or all at once with TOPIC_SUFFIX"
            )
        app = self.with_topics(input_topic or None, output_topic or None) if input_topic or output_topic else self
        return app.with_topic_suffix(topic_suffix)

    def with_topic_suffix(self, suffix: str) -> App:
        """A copy with `suffix` after the name of every topic it names: inputs, tables, global tables, output (the
        TOPIC_SUFFIX setting; fresh topics for each fault run)."""
        if not suffix:
            return self

        def renamed(tables: Mapping[str, Table]) -> dict[str, Table]:
            return {name: replace(t, topic=t.topic + suffix) for name, t in tables.items()}

        return replace(
            self,
            input_topic="",
            inputs=tuple(replace(s, topic=s.topic + suffix) for s in self.streams),
            output_topic=self.output_topic + suffix,
            tables=renamed(self.table_specs),
            global_tables=renamed(self.global_table_specs),
        )
