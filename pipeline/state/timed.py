"""Timers and state TTL, kept in the partition's state (docs/guarantees.md: timers-exactly-once).

Everything lives in the state under reserved keys, so the changelog, the restore, full snapshots and the compaction
job's last-write-wins fold carry timers with no new record type, and one transaction holds a timer's firing (its
entry deleted), the state changes and outputs of its `on_timer`, and the offsets:

    __eos.stream_time            b"<ms>": the input partition's stream time, the largest record timestamp seen
    __eos.timer.stream/<key>     b"<due ms>" or b"<due ms> <payload, encoded by the state serde>"
    __eos.timer.wall/<key>       the same, on wall-clock time (ms since the epoch)
    __eos.ttl/<key>              b"<ms>": when <key> expires, App.state_ttl_ms after its last write, rounded up to a
                                 multiple of App.state_ttl_granularity_ms (if set): written only when that moves it
    __eos.taken                  b"<n>": with several inputs or tables, how many records p has taken (all topics), as
                                 of the last commit: the position that names a timer firing (docs/inputs.md)

The same class keeps state versions (pipeline/state/versions.py): values leave tagged with the App's state version
and come in migrated. An App uses it when it has timers, TTL or a state version above 1 (`App.extended_state`).

A timer is named by (clock, key): scheduling it again moves it, `cancel` deletes it. Due means due time <= now on
its clock; due timers fire in order of due time, then reserved key (so by key; at the same time timers come before
TTL expiries). Keys starting with "__eos." are reserved: the user cannot write them, and iterating the state does not
show them.

In memory a heap per clock of (due ms, reserved key) finds the next due entry without a scan. It may hold stale items
(cancelled, moved, fired, undone): each is checked against the entry when it comes up, and one that was moved later is
queued again there. An undo (a failed record, an aborted transaction) puts entries back and queues them again, so a
firing that was undone fires again. Restore rebuilds the heaps with one pass over the keys (`adopt`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from heapq import heapify, heappop, heappush
from typing import Any, NamedTuple

from pipeline.app import CLOCKS, App, CodeError, Migrate, Timer
from pipeline.serde import JSON, Serde, SerdeError
from pipeline.state.store import PartitionState
from pipeline.state.versions import VERSION_KEY, current_value, refuse_newer, tag

RESERVED = "__eos."
STREAM_TIME_KEY = "__eos.stream_time"
TAKEN_KEY = "__eos.taken"
TIMER_PREFIXES = {"stream": "__eos.timer.stream/", "wall": "__eos.timer.wall/"}
TTL_PREFIX = "__eos.ttl/"
QUEUED_PREFIXES = (*TIMER_PREFIXES.values(), TTL_PREFIX)  # the entries that are due some time


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Due(NamedTuple):
    """A due entry, not yet removed: its reserved key, due time and raw payload (b"": none)."""

    entry: str
    at_ms: int
    payload: bytes


def new_state(app: App, wall_clock: Callable[[], int] = wall_clock_ms) -> PartitionState:
    """A fresh state for one of app's partitions."""
    return TimedState.of(app, wall_clock) if app.extended_state else PartitionState(app.state_serde)


def restored_state(
    app: App, restored: PartitionState, where: str, wall_clock: Callable[[], int] = wall_clock_ms
) -> PartitionState:
    """The state a restore built, ready for app: timers queued, older values migrated; StateVersionError if a newer
    state version wrote it."""
    if not app.extended_state:
        refuse_newer(restored._data, 1, where)
        return restored
    return TimedState.of(app, wall_clock).adopt(restored, where)


class TimedState(PartitionState):
    """A PartitionState that also holds timers, stream time, TTL deadlines and its state version (see the module's
    docstring)."""

    def __init__(
        self,
        serde: Serde = JSON,
        *,
        ttl_ms: int | None = None,
        ttl_clock: str = "stream",
        ttl_granularity_ms: int = 0,
        wall_clock: Callable[[], int] = wall_clock_ms,
        version: int = 1,
        migrate: Migrate | None = None,
    ) -> None:
        super().__init__(serde)
        self._timers = Timers(self)
        self.fires = True  # False: an App without on_timer (TTL or a state version only), which cannot schedule
        self.ttl_ms, self.ttl_clock, self.wall_clock = ttl_ms, ttl_clock, wall_clock
        self.ttl_granularity_ms = ttl_granularity_ms
        self.version, self.migrate = version, migrate
        self.stream_time_ms: int | None = None
        self._queues: dict[str, list[tuple[int, str]]] = {clock: [] for clock in CLOCKS}
        self._queued: dict[str, int] = {}  # reserved key -> the earliest due time queued for it

    @property
    def timers(self) -> Timers:
        """`state.timers`: schedule and cancel this partition's timers."""
        return self._timers

    @staticmethod
    def of(app: App, wall_clock: Callable[[], int] = wall_clock_ms) -> TimedState:
        cls = WallTtlState if app.state_ttl_ms is not None and app.state_ttl_clock == "wall" else TimedState
        state = cls(
            app.state_serde,
            ttl_ms=app.state_ttl_ms,
            ttl_clock=app.state_ttl_clock,
            ttl_granularity_ms=app.state_ttl_granularity_ms,
            wall_clock=wall_clock,
            version=app.state_version,
            migrate=app.migrate,
        )
        state.fires = app.on_timer is not None
        return state

    def adopt(self, restored: PartitionState, where: str = "state") -> TimedState:
        """Takes over the entries of a restored PartitionState (no copy), migrates values written at an older state
        version and queues its timers: one pass over the keys. StateVersionError if a newer version wrote it."""
        data = restored._data
        refuse_newer(data, self.version, where)
        if self.version > 1:
            serde, version, migrate = self._serde, self.version, self.migrate
            for key in [key for key in data if not key.startswith(RESERVED)]:
                data[key] = current_value(data[key], version, serde, migrate, key)
        self._data = data
        self._reindex()
        return self

    # -- what leaves: tagged with the state version ------------------------------------------------------------
    def changes(self) -> Iterator[tuple[str, bytes | None]]:
        version = self.version
        if version == 1:
            yield from super().changes()
            return
        if self._data.get(VERSION_KEY) != b"%d" % version:  # the newest version that wrote to this state
            self._remember(VERSION_KEY)
            self._data[VERSION_KEY] = b"%d" % version
        for key, value in super().changes():
            yield key, value if value is None or key.startswith(RESERVED) else tag(version, value)

    def encoded_items(self) -> Iterable[tuple[str, bytes]]:
        version = self.version
        if version == 1:
            return super().encoded_items()
        return ((key, value if key.startswith(RESERVED) else tag(version, value)) for key, value in self._data.items())

    # -- the mapping the user sees: reserved keys hidden, writes move the key's TTL deadline ----------------------
    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(key, str) and key.startswith(RESERVED):
            raise ValueError(f"state keys starting with {RESERVED!r} are reserved for timers and TTL: {key!r}")
        super().__setitem__(key, value)
        if self.ttl_ms is not None:
            self._move_deadline(TTL_PREFIX + key, self.ttl_ms)

    def _move_deadline(self, entry: str, ttl_ms: int) -> None:
        """A key was written: its deadline is ttl_ms from now, rounded up to the granularity. The same deadline as the
        stored one (the same bucket) is not written again: no undo entry, no queue item, no changelog record."""
        now = self.stream_time_ms if self.ttl_clock == "stream" else self.wall_clock()
        deadline = (now or 0) + ttl_ms
        if grain := self.ttl_granularity_ms:
            deadline = -(-deadline // grain) * grain
        encoded = b"%d" % deadline
        if self._data.get(entry) != encoded:
            self._remember(entry)
            self._data[entry] = encoded
            self._queue(entry, deadline, self.ttl_clock)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        if self.ttl_ms is not None:
            self._drop(TTL_PREFIX + key)

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._data if not key.startswith(RESERVED))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def load(self, entries: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]) -> None:
        super().load(entries)
        self._reindex()

    # -- stream time and due entries (the task and the reference fold) ---------------------------------------------
    def advance_stream_time(self, timestamp_ms: int) -> None:
        """A record with this timestamp was seen: stream time moves forward to it (never back)."""
        if self.stream_time_ms is None or timestamp_ms > self.stream_time_ms:
            self.stream_time_ms = timestamp_ms
            # Remembered once per transaction: it moves before a record's unit of work begins (a failed record does
            # not move it back), so only the transaction's undo needs its value before.
            if STREAM_TIME_KEY not in self._before_txn:
                self._remember(STREAM_TIME_KEY)
            self._data[STREAM_TIME_KEY] = b"%d" % timestamp_ms

    @property
    def taken(self) -> int:
        """With several inputs: the records p had taken at the last `note_taken` (0 before any)."""
        raw = self._data.get(TAKEN_KEY)
        return 0 if raw is None else int(raw)

    def note_taken(self, count: int) -> None:
        """With several inputs: p has taken `count` records so far (written once per transaction, at its commit)."""
        if self.taken != count:
            self._remember(TAKEN_KEY)
            self._data[TAKEN_KEY] = b"%d" % count

    def due(self, clock: str, now_ms: int | None) -> bool:
        """Whether an entry on `clock` may be due at `now_ms` (a stale one may answer True: pop_due decides)."""
        queue = self._queues[clock]
        return bool(queue) and now_ms is not None and queue[0][0] <= now_ms

    def pop_due(self, clock: str, now_ms: int) -> Due | None:
        """The next due entry on `clock` (by due time, then reserved key), still in the state; None if none."""
        queue, queued, data = self._queues[clock], self._queued, self._data
        while queue and queue[0][0] <= now_ms:
            at, entry = heappop(queue)
            if queued.get(entry) == at:
                del queued[entry]
            raw = data.get(entry)
            if raw is None:
                continue  # fired, cancelled or undone
            stored, _, payload = raw.partition(b" ")
            if int(stored) == at:
                return Due(entry, at, payload)
            self._queue(entry, int(stored), clock)  # moved: queued where it is now (a no-op if that is earlier)
        return None

    def has_due(self, clock: str, now_ms: int) -> bool:
        """Whether a timer on `clock` is due at now_ms (stale queue items are dropped on the way)."""
        due = self.pop_due(clock, now_ms)
        if due is None:
            return False
        self._queue(due.entry, due.at_ms, clock)
        return True

    def pending(self, clock: str, key: str) -> Due | None:
        """The timer (clock, key) as a Due entry, whether due or not; None if there is none."""
        raw = self._data.get(TIMER_PREFIXES[clock] + key)
        if raw is None:
            return None
        stored, _, payload = raw.partition(b" ")
        return Due(TIMER_PREFIXES[clock] + key, int(stored), payload)

    def remove(self, due: Due) -> Timer | None:
        """Removes a due entry, in the current unit of work (a firing). The Timer for on_timer; None for a TTL
        expiry, whose key is deleted here as well (a tombstone in the changelog)."""
        self._drop(due.entry)
        if due.entry.startswith(TTL_PREFIX):
            key = due.entry[len(TTL_PREFIX) :]
            if key in self._data:
                self._remember(key)
                del self._data[key]
            return None
        clock = "stream" if due.entry.startswith(TIMER_PREFIXES["stream"]) else "wall"
        payload = self._serde.deserialize(due.payload) if due.payload else None
        return Timer(due.entry[len(TIMER_PREFIXES[clock]) :], due.at_ms, payload, clock)

    # -- internals -----------------------------------------------------------------------------------------------
    def _put(self, entry: str, at_ms: int, payload: bytes) -> None:
        self._remember(entry)
        self._data[entry] = b"%d %s" % (at_ms, payload) if payload else b"%d" % at_ms
        self._queue(entry, at_ms, self._clock_of(entry))

    def _drop(self, entry: str) -> bool:
        if entry not in self._data:
            return False
        self._remember(entry)
        del self._data[entry]
        return True

    def _queue(self, entry: str, at_ms: int, clock: str) -> None:
        """Queues entry at at_ms unless it is queued already at that time or earlier (then pop_due moves it)."""
        queued = self._queued.get(entry)
        if queued is None or at_ms < queued:
            heappush(self._queues[clock], (at_ms, entry))
            self._queued[entry] = at_ms

    def _clock_of(self, entry: str) -> str:
        if entry.startswith(TTL_PREFIX):
            return self.ttl_clock
        return "stream" if entry.startswith(TIMER_PREFIXES["stream"]) else "wall"

    def _restore(self, before: dict[str, Any]) -> None:
        """Undo: entries put back are queued again (a firing that was undone fires again)."""
        super()._restore(before)
        for entry in before:
            if not entry.startswith(RESERVED):
                continue
            raw = self._data.get(entry)
            if entry == STREAM_TIME_KEY:
                self.stream_time_ms = None if raw is None else int(raw)
            elif raw is not None and entry.startswith(QUEUED_PREFIXES):  # not the bookkeeping (taken, version)
                self._queue(entry, int(raw.partition(b" ")[0]), self._clock_of(entry))

    def _reindex(self) -> None:
        """Stream time and the due queues from the entries: C-level passes over the keys, one heapify per clock."""
        data = self._data
        raw = data.get(STREAM_TIME_KEY)
        self.stream_time_ms = None if raw is None else int(raw)
        self._queues = {clock: [] for clock in CLOCKS}
        self._queued = {}
        reserved = [key for key in data if key.startswith(RESERVED)]
        for prefix, clock in (*((p, c) for c, p in TIMER_PREFIXES.items()), (TTL_PREFIX, self.ttl_clock)):
            entries = [key for key in reserved if key.startswith(prefix)]
            # Not in _queued (it only saves duplicate queue items; pop_due skips them anyway): a restore stays quick.
            due = [int(data[key].partition(b" ")[0]) for key in entries]
            self._queues[clock].extend(zip(due, entries, strict=True))
        for queue in self._queues.values():
            heapify(queue)


class WallTtlState(TimedState):
    """State TTL on the wall clock: expiry fires on the poll loop, and until it has, an expired key reads as
    absent already."""

    def _expired(self, key: str) -> bool:
        deadline = self._data.get(TTL_PREFIX + key)
        return deadline is not None and int(deadline) <= self.wall_clock()

    def __getitem__(self, key: str) -> Any:
        if self._expired(key):
            raise KeyError(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return default if self._expired(key) else super().get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and not self._expired(key) and super().__contains__(key)


def _clock(clock: str) -> str:
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, not {clock!r}")
    return clock


class Timers:
    """`state.timers`: schedule and cancel this partition's timers from `process` or `on_timer`. Each change is part
    of the current record's unit of work: undone with it if it fails, committed with its outputs."""

    def __init__(self, state: TimedState) -> None:
        self._state = state

    def schedule(self, key: str, at_ms: int, payload: Any = None, clock: str = "stream") -> None:
        """Timer (clock, key) fires once `clock` reaches at_ms, with `payload` (anything the state serde encodes).
        Scheduling an existing one moves it and replaces its payload."""
        if not isinstance(key, str) or clock not in CLOCKS:
            raise ValueError(f"a timer needs a str key and a clock in {CLOCKS}, not {key!r}, {clock!r}")
        state = self._state
        if not state.fires:
            raise CodeError("process", "schedules a timer, but the App has no on_timer", "give the App on_timer=...")
        encoded = b"" if payload is None else state._serde.serialize(payload)
        if encoded is None:  # b"" is "no payload": a payload encoded as None would be lost
            raise SerdeError(f"the state serde encoded a timer payload {type(payload).__name__} as None")
        state._put(TIMER_PREFIXES[clock] + key, int(at_ms), encoded)

    def cancel(self, key: str, clock: str = "stream") -> bool:
        """Deletes timer (clock, key); False if there was none."""
        return self._state._drop(TIMER_PREFIXES[_clock(clock)] + key)

    def get(self, key: str, clock: str = "stream") -> Timer | None:
        _clock(clock)
        due = self._state.pending(clock, key)
        if due is None:
            return None
        return Timer(key, due.at_ms, self._state._serde.deserialize(due.payload) if due.payload else None, clock)

    def __iter__(self) -> Iterator[Timer]:
        """Every pending timer, in firing order per clock (stream, then wall). A scan of the state: for tests."""
        found: list[Timer] = []
        for clock, prefix in TIMER_PREFIXES.items():
            keys = [key[len(prefix) :] for key in self._state._data if key.startswith(prefix)]
            found.extend(timer for key in keys if (timer := self.get(key, clock)) is not None)
        return iter(sorted(found, key=lambda t: (CLOCKS.index(t.clock), t.at_ms, t.key)))

    @property
    def stream_time_ms(self) -> int | None:
        """The largest record timestamp seen in this input partition (None before the first)."""
        return self._state.stream_time_ms

    @property
    def wall_time_ms(self) -> int:
        """Wall-clock time as the runtime sees it (the test driver's clock in tests): use it, not time.time()."""
        return self._state.wall_clock()
