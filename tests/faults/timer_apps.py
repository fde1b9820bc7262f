"""Apps for the timer fault tests, run by the pipeline processes (`pipeline run tests.faults.timer_apps:wall`)."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.app import App, Output, Record, State, Timer
from pipeline.testing.inputs import running_totals_records

WALL_DELAY_MS = 500


def schedule_wall(state: State, record: Record) -> Iterable[Output]:
    """Counts the account's records and schedules one wall-clock timer per record, WALL_DELAY_MS from now."""
    count = state.get(record.key, 0) + 1
    state[record.key] = count
    state.timers.schedule(
        f"{record.key}/{count}", state.timers.wall_time_ms + WALL_DELAY_MS, payload=record.value["id"], clock="wall"
    )
    return (Output(key=record.key, value={"id": record.value["id"], "count": count}),)


def fire_wall(state: State, timer: Timer) -> Iterable[Output]:
    state["fired"] = state.get("fired", 0) + 1
    return (Output(key=timer.key, value={"timer": timer.payload}),)


wall = App(
    name="wall-timers",
    input_topic="wall-input",
    output_topic="wall-output",
    process=schedule_wall,
    on_timer=fire_wall,
    generate=lambda n, partitions, seed: running_totals_records(n, partitions=partitions, seed=seed),
)
