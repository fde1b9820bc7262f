"""An App with a stream-time timer per account and state TTL, run by the pipeline processes of
tests/snapshots/test_snapshot_timers.py (`pipeline run tests.snapshots.timed_app:app`)."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.app import App, Output, Record, State, Timer

IDLE_MS = 60_000  # each account's timer fires this long (in stream time) after its last record
TTL_MS = 30_000  # an account's count is forgotten this long after its last record


def process(state: State, record: Record) -> Iterable[Output]:
    count = state.get(record.key, 0) + 1
    state[record.key] = count
    state.timers.schedule(record.key, record.timestamp_ms + IDLE_MS, payload=count)  # moved by each record
    return (Output(key=record.key, value={"id": record.value["id"], "count": count}),)


def on_timer(state: State, timer: Timer) -> Iterable[Output]:
    return (Output(key=timer.key, value={"idle": timer.payload}),)


app = App(
    name="timed-ttl",
    input_topic="timed-input",
    output_topic="timed-output",
    process=process,
    on_timer=on_timer,
    state_ttl_ms=TTL_MS,
)
