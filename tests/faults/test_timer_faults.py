"""Timers exactly once in committed output against real pipeline processes on a real broker, under SIGKILLs and a
SIGSTOP zombie (docs/guarantees.md: timers-exactly-once); every test asserts the checker's verdict."""

from __future__ import annotations

import random
import time

from pipeline.examples import windowed_totals
from pipeline.testing import inputs
from pipeline.testing.harness import wait_caught_up
from tests.faults.conftest import PARTITIONS, assert_exactly_once, busiest_owner
from tests.support import eventually

WINDOWED = "pipeline.examples.windowed_totals:app"
WALL = "tests.faults.timer_apps:wall"


def kill_rounds(run, fleet, rounds: int, seed: int, owners_only: bool = False) -> None:
    """SIGKILLs while the input is being processed (outputs seen): timers scheduled and not fired yet are lost with
    the process unless the changelog has them. owners_only: each kill strikes the busiest owner once both own
    partitions, never a process that has not joined yet (which loses nothing)."""
    rng = random.Random(seed)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    for _ in range(rounds):
        time.sleep(rng.uniform(1.5, 3.0))
        (busiest_owner(run, fleet) if owners_only else rng.choice(fleet.alive)).kill()
        fleet.start(1)


def timer_outputs(verdict) -> int:
    return sum(1 for out in verdict.final_outputs if any(name == "eos.timer" for name, _ in out.headers))


def test_windows_close_exactly_once_under_sigkill_rounds(fault_run):
    run = fault_run(WINDOWED)
    records = list(windowed_totals.generate(15_000, PARTITIONS, 11))
    run.feed(records, seconds=12)
    kill_rounds(run, run.start(2), rounds=3, seed=11)
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == timer_outputs(outcome.verdict) > 500  # every output is a closed window
    assert outcome.verdict.dead_letters > 50  # the late records


def test_windows_close_exactly_once_with_a_zombie_past_the_session_timeout(fault_run):
    run = fault_run(WINDOWED)
    run.feed(list(windowed_totals.generate(15_000, PARTITIONS, 12)), seconds=12)
    fleet = run.start(2)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    zombie = busiest_owner(run, fleet)
    time.sleep(1)
    zombie.pause()  # mid-stream: windows scheduled, some firing in its open transaction
    time.sleep(9)  # past session.timeout.ms (6 s): the other instance takes over, fences and restores the timers
    zombie.resume()
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert "lost [" in zombie.log_path.read_text(), "the zombie never noticed it lost its partitions"


def test_wall_clock_timers_fire_exactly_once_under_sigkills_and_a_zombie(fault_run):
    run = fault_run(WALL)
    records = list(inputs.running_totals_records(6_000, partitions=PARTITIONS, seed=13))
    run.feed(records, seconds=10)
    fleet = run.start(2)
    kill_rounds(run, fleet, rounds=2, seed=13)
    zombie = fleet.alive[0]
    zombie.pause()
    time.sleep(8)
    zombie.resume()
    assert not wait_caught_up(run.bootstrap, run.app_id, run.input_topic, PARTITIONS, 120)
    eventually(lambda: _all_fired(run, len(records)), timeout_s=30)  # the last ones are due WALL_DELAY_MS later
    outcome = run.finish()
    assert_exactly_once(outcome)
    assert timer_outputs(outcome.verdict) == len(records) and outcome.verdict.outputs == 2 * len(records)


def _all_fired(run, expected: int) -> bool:
    """Whether the read_committed observer has seen `expected` timer outputs (or more: the verdict judges those)."""
    return sum(1 for r in list(run.observer.records) if any(name == "eos.timer" for name, _ in r.headers)) >= expected


def test_the_sigkill_test_fails_when_timers_are_kept_outside_the_transaction(fault_run):
    """The same run as test_windows_close_exactly_once_under_sigkill_rounds against a double that leaves the timer
    entries out of the changelog (tests/faults/timers_outside.py): restored partitions lose their pending windows,
    and the checker finds windows that never closed. This shows the test above can fail. Every run fails the
    checker (the timer entries are missing from the changelog); windows lost need a kill that strikes an owner with
    windows open: up to three runs for that. In a CI run two of three kills struck processes just started, owning
    nothing yet, and the one restore lost no window the checker counts: hence the kills now strike owners only."""
    summaries = []
    for seed in (11, 12, 13):
        run = fault_run("tests.faults.timers_outside:app")
        run.feed(list(windowed_totals.generate(15_000, PARTITIONS, seed)), seconds=12)
        kill_rounds(run, run.start(2), rounds=3, seed=seed, owners_only=True)
        outcome = run.finish()
        assert outcome.verdict is not None and not outcome.verdict.ok
        assert outcome.verdict.state.count > 0, outcome.verdict.summary()
        summaries.append(outcome.verdict.summary())
        if outcome.verdict.losses.count > 0:
            return
    raise AssertionError("no run lost a window:\n" + "\n".join(summaries))
