"""Timers in the reference fold and in the checks (docs/guarantees.md: timers-exactly-once).

The reference keeps timers, stream time and TTL deadlines in the same TimedState as the runtime (they are part of the
state, and the state's bytes are compared), but fires them with its own loop, written from the rule, not from the
runtime's firing code:

- stream time: before each input record (also one that is dead-lettered or fails), stream time moves to its
  timestamp and every stream timer due then fires, by due time then key, before the record is processed. Such a
  firing is named (partition, that record's offset, "stream", due time, key): the same name the runtime's eos.timer
  header gives its outputs. With several inputs or tables (oracle/inputs.py) the records are those of every topic of
  p in the order the run took them, and the position is the record's place in that order (records taken before it).
- wall clock: when a wall-clock timer fires depends on the machine's clock, so the reference cannot know it. It fires
  each one where the run's outputs say it fired (position, due time), if it is pending there; a firing the reference
  cannot place is reported. A wall-clock timer whose on_timer wrote no output, and TTL on the wall clock, leave no
  trace in the outputs: the reference does not fire them (the state check then reports the difference), and pending
  wall-clock timers are compared by payload only (their due times come from the clock).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from pipeline.app import DEAD_LETTERS, App, Output
from pipeline.core.deadletter import PREFIX as DEAD_LETTER_PREFIX
from pipeline.core.provenance import TIMER_HEADER, TimerSource, decode_timer
from pipeline.state.store import PartitionState
from pipeline.state.timed import RESERVED, TIMER_PREFIXES, TTL_PREFIX, Due, TimedState
from pipeline.state.versions import VERSION_KEY, StateVersionError, current_value, tag
from pipeline.testing.oracle.records import Coord, ExpectedOutput, KafkaRecord
from pipeline.testing.oracle.verdict import Findings, Verdict

Encode = Callable[[Output], ExpectedOutput]
DEAD_LETTER_TIMER = DEAD_LETTER_PREFIX + "timer"  # a timer's dead letter names its firing here


def new_state(app: App) -> PartitionState:
    """The reference's state of one partition: timed as the App's, with a wall clock that stands still."""
    return TimedState.of(app, wall_clock=lambda: 0) if app.extended_state else PartitionState(app.state_serde)


def timer_name(firing: TimerSource) -> str:
    return f"timer {firing.partition}@{firing.position} {firing.clock} {firing.at_ms} {firing.key!r}"


class Firings:
    """What the reference fires, and what it could not: outputs per firing, failures, unplaceable run firings."""

    def __init__(
        self,
        app: App,
        encode: Encode,
        output_topic: str,
        wall_firings: Iterable[TimerSource],
        held: Callable[[Output], None] | None = None,
    ) -> None:
        self.app, self.encode, self.output_topic = app, encode, output_topic
        self.held = held  # an on_timer output that dead-letters a held record (app.dead_letter); None: ignored
        self.outputs: dict[TimerSource, list[ExpectedOutput]] = {}
        self.failures: dict[TimerSource, str] = {}
        self.unplaceable: list[tuple[TimerSource, str]] = []
        self._walls: dict[int, list[TimerSource]] = defaultdict(list)
        for firing in sorted(set(wall_firings), key=lambda f: (f.position, f.at_ms, f.key), reverse=True):
            self._walls[firing.partition].append(firing)  # popped from the end: earliest first

    def before_record(self, state: TimedState, record: KafkaRecord) -> None:
        self.before(state, record.partition, record.offset, record.timestamp_ms)

    def before(self, state: TimedState, partition: int, position: int, timestamp_ms: int) -> None:
        """What fires before the record at `position` of `partition`, which has this timestamp."""
        self.walls_until(state, partition, position)
        if timestamp_ms >= 0:
            state.advance_stream_time(timestamp_ms)
        # No stream time yet (no record with a timestamp so far): nothing is due, as in the runtime (core/timers.py).
        while (now := state.stream_time_ms) is not None and (due := state.pop_due("stream", now)) is not None:
            key = due.entry[len(TIMER_PREFIXES["stream"]) :]
            self._fire(state, due, TimerSource(partition, position, "stream", due.at_ms, key))

    def walls_until(self, state: TimedState, partition: int, position: int | None) -> None:
        """Fires the run's wall-clock firings of `partition` placed before `position` (None: all that are left)."""
        walls = self._walls[partition]
        while walls and (position is None or walls[-1].position <= position):
            firing = walls.pop()
            due = state.pending("wall", firing.key)
            if due is None:
                self.unplaceable.append(
                    (
                        firing,
                        "the run fired it, but no such wall-clock timer is pending here in "
                        "the reference (fired before, or never scheduled)",
                    )
                )
            else:
                self._fire(state, due._replace(at_ms=firing.at_ms), firing)

    def _fire(self, state: TimedState, due: Due, firing: TimerSource) -> None:
        state.begin_record()
        timer = state.remove(due)
        if timer is not None:
            try:
                if self.app.on_timer is None:  # as the runtime says it (core/timers.py)
                    raise TypeError(f"{self.app.name}: a timer is due but the App has no on_timer")
                outputs = list(self.app.on_timer(state, timer))
                self.outputs.setdefault(firing, []).extend(
                    self.encode(out) for out in outputs if out.topic in (None, self.output_topic)
                )
                for out in outputs:
                    if out.topic is DEAD_LETTERS and self.held is not None:
                        self.held(out)
            except Exception as e:
                state.undo_record()
                state.remove(due)  # the runtime dead-letters it (or stops, ON_POISON=stop): removed, changes undone
                self.failures[firing] = f"on_timer: {type(e).__name__}: {e}"
        state.commit()


def timer_outputs(outputs: Iterable[KafkaRecord], content: Findings) -> dict[TimerSource, list[KafkaRecord]]:
    """Outputs grouped by the timer firing their eos.timer header names, each group in (partition, offset) order."""
    grouped: dict[TimerSource, list[KafkaRecord]] = defaultdict(list)
    for out in sorted(outputs, key=lambda r: r.coord):
        try:
            firing = decode_timer(out.headers)
        except ValueError:
            content.add(f"out {out.partition}@{out.offset}", "unreadable eos.timer header")
            continue
        if firing is not None:
            grouped[firing].append(out)
    return dict(grouped)


def timer_dead_letters(records: Iterable[KafkaRecord]) -> list[TimerSource]:
    """The firings the run dead-lettered (their on_timer kept failing), one entry per dead letter."""
    letters = []
    for record in records:
        fields = dict(record.headers)
        if (timer := fields.get(DEAD_LETTER_TIMER)) is not None:
            letters.append(decode_timer([(TIMER_HEADER, timer)]))
    return [letter for letter in letters if letter is not None]


def check_timers(
    by_firing: Mapping[TimerSource, list[KafkaRecord]],
    firings: Firings,
    verdict: Verdict,
    mismatch: Callable[[KafkaRecord, ExpectedOutput], str],
    dead: Sequence[TimerSource] = (),
) -> set[Coord]:
    """Each firing's outputs against the reference's, into the verdict's categories; returns the positions of outputs
    beyond the reference's count (duplicates), which the order check skips. `dead`: the firings the run dead-lettered,
    each of which must be one whose on_timer fails in the reference too, once."""
    _check_timer_dead_letters(dead, firings, verdict)
    extras: set[Coord] = set()
    for firing in sorted(by_firing.keys() | firings.outputs.keys()):
        outs, expected, where = by_firing.get(firing, []), firings.outputs.get(firing), timer_name(firing)
        if expected is None:
            why = firings.failures.get(firing, "the reference fires no such timer there")
            verdict.content.add(where, f"{len(outs)} output(s), though {why}")
            continue
        if len(outs) > len(expected):
            verdict.duplicates.add(where, f"{len(outs)} outputs, the reference's firing produces {len(expected)}")
            extras.update(out.coord for out in outs[len(expected) :])
        elif len(outs) < len(expected):
            verdict.losses.add(where, f"{len(outs)} of {len(expected)} output(s)")
        for out, want in zip(outs, expected, strict=False):
            if problem := mismatch(out, want):
                verdict.content.add(where, f"out {out.partition}@{out.offset}: {problem}")
    for firing, why in firings.unplaceable:
        verdict.duplicates.add(timer_name(firing), why)
    for firing, why in firings.failures.items():
        if firing not in by_firing and firing not in dead:
            verdict.losses.add(timer_name(firing), f"{why} offline, no dead letter: the run should have stopped there")
    return extras


def _check_timer_dead_letters(dead: Sequence[TimerSource], firings: Firings, verdict: Verdict) -> None:
    for firing, count in Counter(dead).items():
        if firing not in firings.failures:
            verdict.content.add(timer_name(firing), "dead-lettered, though its on_timer succeeds in the reference")
        elif count > 1:
            verdict.duplicates.add(timer_name(firing), f"dead-lettered {count} times")


def comparable(app: App, entries: dict[str, bytes]) -> dict[str, bytes]:
    """A state for comparison: values at the App's state version (older ones migrated, as a restore does), pending
    wall-clock timers by payload only (their due times come from the clock), and without `__eos.state_version`
    (written with the first commit of each process: bookkeeping the reference has no commits for)."""
    if not app.extended_state:
        return entries
    wall, wall_ttl = TIMER_PREFIXES["wall"], TTL_PREFIX if app.state_ttl_clock == "wall" else None
    found = {}
    for key, value in entries.items():
        if key == VERSION_KEY or (wall_ttl and key.startswith(wall_ttl)):
            continue
        if key.startswith(wall):
            value = value.partition(b" ")[2]
        elif app.state_version > 1 and not key.startswith(RESERVED):
            value = _at_current_version(app, key, value)
        found[key] = value
    return found


def _at_current_version(app: App, key: str, value: bytes) -> bytes:
    try:
        return tag(app.state_version, current_value(value, app.state_version, app.state_serde, app.migrate, key))
    except StateVersionError:
        return value  # newer than the App: left as it is, so the difference shows
