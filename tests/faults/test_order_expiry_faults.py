"""Timers with two inputs (pipeline.examples.order_expiry: orders and fills merged by timestamp, an event-time expiry
per order, orphan fills dead-lettered by a timer, state removed by TTL) against real pipeline processes on a real
broker, in the PRODUCERS mode the environment gives (tests/run.sh runs both): SIGKILL take-overs, a zombie, and a
take-over from a warm standby copy. The checker replays the recorded merge order and fires the same timers at the same
positions (docs/guarantees.md: stream-time); its verdict includes order_expiry.check (App.check): every fill once, at
most one expiry per order and nothing after it, no expiry before its due time."""

from __future__ import annotations

import random
import time

from pipeline.examples import order_expiry
from pipeline.testing.faults import FAULTS
from tests.faults.conftest import PARTITIONS, assert_exactly_once, busiest_owner
from tests.faults.test_standby_promotion import RESTORED_FROM_COPY, _warm_pair
from tests.support import eventually

SPEC = "pipeline.examples.order_expiry:app"


def expiries_and_fills(outcome) -> None:
    """The run exercised what it is about: fills, expiries fired by timers, and the App's own check clean."""
    verdict = outcome.verdict
    assert verdict.outputs > 500, verdict.summary()
    assert verdict.app.count == 0, verdict.app.samples
    statuses = {order_expiry._json(r.value)["status"] for r in verdict.final_outputs}
    assert statuses == {"open", "filled", "expired"}, statuses


def test_order_expiry_exactly_once_under_sigkill_take_overs(fault_run):
    run = fault_run(SPEC)
    run.feed(list(order_expiry.generate(6_000, PARTITIONS, 31)), seconds=12)
    fleet = run.start(2)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    rng = random.Random(31)
    for _ in range(3):
        time.sleep(rng.uniform(1.5, 3.0))
        FAULTS["sigkill"].inject(fleet, rng)  # a replacement restores the state, the timers and __eos.taken
    outcome = run.finish()
    assert_exactly_once(outcome)
    expiries_and_fills(outcome)


def test_order_expiry_exactly_once_with_a_zombie(fault_run):
    run = fault_run(SPEC)
    run.feed(list(order_expiry.generate(6_000, PARTITIONS, 32)), seconds=14)
    fleet = run.start(2)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    zombie = busiest_owner(run, fleet)
    zombie.pause()  # mid-merge, timers due: the other instance fences it and fires them itself
    time.sleep(9)  # past session.timeout.ms (6 s)
    zombie.resume()
    outcome = run.finish()
    assert_exactly_once(outcome)
    expiries_and_fills(outcome)
    assert "lost [" in zombie.log_path.read_text(), "the zombie never noticed it lost its partitions"


def test_order_expiry_exactly_once_taken_over_from_a_standby_copy(fault_run):
    run = fault_run(SPEC, standby_replicas="1")
    run.feed(list(order_expiry.generate(6_000, PARTITIONS, 33)), seconds=14)
    fleet = run.start(2)
    victim, peer = _warm_pair(run, fleet)
    time.sleep(2)  # the copies follow the owner's commits: timers and stream time among them
    victim.kill()
    eventually(lambda: RESTORED_FROM_COPY in peer.log_path.read_text(), 60, 0.2)
    outcome = run.finish(timeout_s=180)
    assert_exactly_once(outcome)
    expiries_and_fills(outcome)
