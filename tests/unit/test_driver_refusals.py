"""The test driver refuses what it cannot do, and its strict mode finds a state value changed in place but never
assigned back (pipeline/testing/strict.py), which the runtime cannot see: the change is simply lost."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pipeline.app import App, Output, Record, State, Timer
from pipeline.core.processing import CodeStop
from pipeline.testing.driver import AppDriver, PartitionStopped
from pipeline.testing.pytest_plugin import pipeline_driver  # noqa: F401 - the fixture, as users import it


def mutates(state: State, record: Record) -> Iterable[Output]:
    totals = state.get(record.key, {"n": 0})
    totals["n"] += 1  # a fresh copy: lost unless assigned back
    if record.value == "assign":
        state[record.key] = totals
    return [Output(totals)]


def generates(state: State, record: Record) -> Iterable[Output]:
    state[record.key] = {"n": 0}
    totals = state[record.key]
    totals["n"] += 1
    yield Output(totals)


def test_an_unknown_partition_is_refused() -> None:
    driver = AppDriver(App("a", "in", "out", mutates))
    for call in (
        lambda: driver.send("k", "assign", partition=3),
        lambda: driver.send_bytes(b"k", b'"x"', partition=-1),
        lambda: driver.produce("k", "x", partition=1),
        lambda: driver.state(2),
        lambda: driver.timers(5),
    ):
        with pytest.raises(
            ValueError, match=r"this driver has 1 partition\(s\), 0..0 \(AppDriver\(app, partitions=N\)"
        ):
            call()


def test_an_unknown_clock_is_refused_by_the_timers() -> None:
    def cancel(state: State, record: Record) -> Iterable[Output]:
        state.timers.cancel(record.key, clock="event")
        return []

    app = App("c", "in", "out", cancel, on_timer=lambda state, timer: [])
    driver = AppDriver(app, processing_max_attempts=1)
    driver.send("k", "x")
    [letter] = driver.dead_letters
    assert letter.error_message == "clock must be one of ('stream', 'wall'), not 'event'"


@pytest.mark.parametrize("process", [mutates, generates])
def test_strict_mode_finds_a_state_value_changed_in_place_and_not_assigned(process) -> None:
    driver = AppDriver(App("m", "in", "out", process), strict=True)
    if process is mutates:
        driver.send("k", "assign")  # assigned back: fine
        assert driver.state() == {"k": {"n": 1}}
    with pytest.raises(
        PartitionStopped, match=r"process changed the value of state\['k'\] in place without assigning"
    ) as stop:
        driver.send("k", "forget")
    assert "assign it back: value = state[key]" in stop.value.fix and isinstance(stop.value.__cause__, CodeStop)


def test_strict_mode_watches_on_timer_too() -> None:
    def schedule(state: State, record: Record) -> Iterable[Output]:
        state["seen"] = [record.key]
        state.timers.schedule(record.key, 10)
        return []

    def fired(state: State, timer: Timer) -> Iterable[Output]:
        state["seen"].append(timer.key)  # the copy, not the state
        return []

    driver = AppDriver(App("t", "in", "out", schedule, on_timer=fired), strict=True)
    driver.send("a", 1, timestamp_ms=0)
    with pytest.raises(PartitionStopped, match=r"on_timer changed the value of state\['seen'\]"):
        driver.send("b", 1, timestamp_ms=10)


def test_without_strict_mode_the_change_is_lost_silently() -> None:
    driver = AppDriver(App("m", "in", "out", mutates))
    driver.send("k", "forget")
    assert driver.state() == {}


def test_the_pytest_plugin_makes_strict_drivers(pipeline_driver) -> None:  # noqa: F811
    assert pipeline_driver(App("m", "in", "out", mutates)).strict
    assert not pipeline_driver(App("m", "in", "out", mutates), strict=False).strict
