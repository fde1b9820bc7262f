"""Firing due timers into the open transaction of one input partition (docs/guarantees.md: timers-exactly-once).

The state side (where timers live, which one is due next) is pipeline/state/timed.py. Here each due timer becomes
one unit of work, like a record: its entry is removed and `on_timer` runs, and both are undone together if it
raises; its outputs carry the eos.timer header (pipeline/core/provenance.py) instead of eos.source. A TTL expiry is the
same unit without a callback: the key and its deadline deleted (tombstones in the changelog).

When they fire:
- stream time: before the record that moves stream time to or past their due time (and before any record while one
  is due: a timer scheduled in the past fires before the next record). Position = that record's offset;
- wall clock: on the poll loop's turn (`KafkaTask.tick`), even when no record arrives. Position = the next offset
  to process.
At most `budget` timers fire per call: a burst of due timers is spread over loop turns, so the poll loop keeps
polling (and the partition its membership). A failing `on_timer` takes a record's path (docs/guarantees.md:
fail-fast): retried, then dead-lettered (the timer's key and payload, its coordinates in the header eos.dlq.timer; the
entry removed, on_timer's changes undone) or, with ON_POISON=stop, p stops; a CodeError (a wrong return type, no
on_timer) stops p at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from pipeline.app import App, CodeError, Output, Timer, checked_outputs
from pipeline.core.deadletter import DeadLetter
from pipeline.core.processing import CodeStop, PoisonRecordStop
from pipeline.core.provenance import TIMER_HEADER, encode_timer
from pipeline.core.task import StormGuard
from pipeline.kafka.records import Consumed
from pipeline.retry import Backoff, retry
from pipeline.serde import background_registry_lookups
from pipeline.settings import Settings
from pipeline.state.timed import TIMER_PREFIXES, TTL_PREFIX, Due, TimedState

log = logging.getLogger(__name__)
# The task's produce: (topic, key bytes, value bytes, partition or -1, headers) into the open transaction.
Produce = Callable[[str, Any, Any, int, list[tuple[str, bytes]]], None]
# An output as the producer takes it (KafkaTask._encoder).
Encoded = tuple[str, Any, Any, int, Any]


@dataclass
class TimerFiring:
    """One partition's firing of due timers, and the records held back while a burst of them fires."""

    app: App
    partition: int
    encode: Callable[[Output], Encoded]
    produce: Produce
    pause_input: Callable[[bool], None]  # True: stop fetching p (records are held), False: fetch again
    errors: Counter  # failed attempts of this partition (records and timers alike)
    max_attempts: int
    backoff_s: float
    budget: int  # timers fired per call at most (TIMERS_PER_TURN)
    stop_on_poison: bool
    dead_letter: Callable[[DeadLetter], None]  # into the open transaction, as a record's
    input_topic: str
    storm: StormGuard  # the task's dead-letter storm guard for timers
    sleep: Callable[[float], None] = time.sleep
    held: list[Consumed] = field(default_factory=list)
    _paused: bool = False

    @classmethod
    def of(
        cls,
        app: App,
        settings: Settings,
        partition: int,
        encode: Callable[[Output], Encoded],
        produce: Produce,
        pause_input: Callable[[bool], None],
        errors: Counter,
        dead_letter: Callable[[DeadLetter], None],
        storm: StormGuard,
    ) -> TimerFiring:
        return cls(
            app,
            partition,
            encode,
            produce,
            pause_input,
            errors,
            settings.processing_max_attempts,
            settings.processing_backoff_ms / 1000,
            settings.timers_per_turn,
            settings.on_poison == "stop",
            dead_letter,
            app.input_topic,
            storm,
        )

    def before_record(self, state: TimedState, offset: int, timestamp_ms: int) -> bool:
        """Stream time moves to the record's timestamp and the stream timers now due fire, at most `budget` of
        them. False: some are still due, so the record must wait (`hold`) for the next turn."""
        if timestamp_ms >= 0:
            state.advance_stream_time(timestamp_ms)
        now_ms = state.stream_time_ms
        if now_ms is None or not state.due("stream", now_ms):
            return True
        return self.fire(state, "stream", now_ms, offset)

    def fire(self, state: TimedState, clock: str, now_ms: int, position: int) -> bool:
        """Fires up to `budget` timers due at now_ms on `clock`, each tagged with `position`; True when none is
        left due."""
        for _ in range(self.budget):
            due = state.pop_due(clock, now_ms)
            if due is None:
                return True
            self._fire_one(state, due, clock, position)
        return not state.has_due(clock, now_ms)

    # -- records held behind a burst of due timers -------------------------------------------------------------------
    def hold(self, messages: list[Consumed]) -> None:
        """These records (the first one's timers not all fired yet) wait, and p is not fetched meanwhile."""
        self.held = messages
        if not self._paused:
            self._paused = True
            self.pause_input(True)

    def take_held(self) -> list[Consumed]:
        held, self.held = self.held, []
        return held

    def release(self) -> None:
        """Nothing is held any more (all processed, or to be fetched again after a rewind): p is fetched again."""
        self.held = []
        if self._paused:
            self._paused = False
            self.pause_input(False)

    def _fire_one(self, state: TimedState, due: Due, clock: str, position: int) -> None:
        if due.entry.startswith(TTL_PREFIX):  # a TTL expiry: no callback, no retry machinery
            state.begin_record()
            try:
                state.remove(due)
            except CodeError as error:  # STATE_STORE=disk: the expired value, migrated as it is read, failed
                state.undo_record()
                raise CodeStop(f"{self.input_topic}[{self.partition}] TTL expiry of {due.entry}", error) from error
            return
        timer: Timer | None = None
        on_timer = self.app.on_timer

        def attempt() -> list[Encoded]:
            nonlocal timer
            state.begin_record()
            timer = state.remove(due)  # None: a TTL expiry, which has no callback
            if timer is None:
                return []
            if on_timer is None:
                raise CodeError("on_timer", "is missing, but a timer is due", "give the App on_timer=...")
            # A timer has no record to wait at (RegistryPending): its outputs' registry look-up, if any, runs inline.
            inline = background_registry_lookups.set(False)
            try:
                return [self.encode(o) for o in checked_outputs("on_timer", on_timer(state, timer))]
            finally:
                background_registry_lookups.reset(inline)

        def failed(error: Exception, failures: int, delay: float | None) -> None:
            state.undo_record()  # the entry is back (queued again) with everything on_timer changed undone
            self.errors.inc()

        try:
            outputs = attempt()  # the first attempt inline: the retry machinery only after a failure
        except Exception as first:
            try:
                outputs = self._retried(attempt, failed, first)
            except Exception as error:  # on_timer failed every time
                self._gave_up(state, due, clock, position, error)
                return
        if timer is not None:
            self.storm.reset()  # fired without failing: a run of timer dead letters ends
        if outputs and timer is not None:
            header = (TIMER_HEADER, encode_timer(self.partition, position, clock, due.at_ms, timer.key))
            for topic, key, value, partition, headers in outputs:
                self.produce(topic, key, value, partition, [*headers, header] if headers else [header])

    def _retried(
        self,
        attempt: Callable[[], list[Encoded]],
        failed: Callable[[Exception, int, float | None], None],
        first: Exception,
    ) -> list[Encoded]:
        """After a failed first attempt: again, as a record's (a CodeError is not retried)."""
        return retry(
            attempt,
            retriable=lambda e: not isinstance(e, CodeError),
            backoff=Backoff(self.backoff_s),
            attempts=self.max_attempts,
            first_error=first,
            on_failure=failed,
            sleep=self.sleep,
        )

    def _gave_up(self, state: TimedState, due: Due, clock: str, position: int, error: Exception) -> None:
        """A timer whose on_timer kept failing: a CodeError stops p at once, ON_POISON=stop stops it, else a dead
        letter takes its place: the entry removed in a unit of its own, written in the open transaction."""
        key = due.entry[len(TIMER_PREFIXES[clock]) :]
        coordinates = encode_timer(self.partition, position, clock, due.at_ms, key).decode()
        where = f"{self.input_topic}[{self.partition}] on_timer(timer {coordinates} = partition:position:clock:due:key)"
        if isinstance(error, CodeError):
            raise CodeStop(where, error) from error
        if self.stop_on_poison:
            raise PoisonRecordStop(f"{where} failed {self.max_attempts} times: {type(error).__name__}: {error}")
        self.storm.note(type(error).__name__, where, 0, 0)  # every timer dead letter continues the run
        state.begin_record()
        state.remove(due)
        log.warning("dead-lettered %s after %d attempts: %s: %s", where, self.max_attempts, type(error).__name__, error)
        letter = DeadLetter(
            self.input_topic,
            self.partition,
            position,
            key.encode(),
            due.payload or None,
            type(error).__name__,
            str(error),
            self.max_attempts,
            timer=coordinates,
        )
        self.dead_letter(letter)
