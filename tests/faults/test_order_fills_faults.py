"""Several inputs and a co-partitioned table (pipeline.examples.order_fills: orders and fills merged by timestamp, an
accounts table joined) against real pipeline processes on a real broker: the checker replays the committed processing
order and the App's own checks (no fill counted twice, no order overfilled) hold under SIGKILLs, a SIGTERM and a
zombie (docs/inputs.md). Every test asserts the checker's verdict."""

from __future__ import annotations

import random
import time

from pipeline.examples import order_fills
from pipeline.testing.faults import FAULTS
from tests.faults.conftest import PARTITIONS, assert_exactly_once, busiest_owner
from tests.support import eventually

SPEC = "pipeline.examples.order_fills:app"


def fills_and_table_updates(verdict) -> None:
    """The run exercised what it is about: outputs from both inputs, and table updates in the replayed order."""
    assert verdict.outputs > 300, verdict.summary()
    assert verdict.app.count == 0, verdict.app.samples


def test_orders_and_fills_exactly_once_under_sigkill_rounds(fault_run):
    run = fault_run(SPEC)
    run.feed(list(order_fills.generate(6_000, PARTITIONS, 21)), seconds=12)
    fleet = run.start(2)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    rng = random.Random(21)
    for _ in range(2):
        time.sleep(rng.uniform(1.5, 3.0))
        FAULTS["sigkill"].inject(fleet, rng)  # kills one, starts a replacement: it restores state and the table
    outcome = run.finish()
    assert_exactly_once(outcome)
    fills_and_table_updates(outcome.verdict)


def test_orders_and_fills_exactly_once_with_a_zombie_then_a_sigterm(fault_run):
    run = fault_run(SPEC)
    run.feed(list(order_fills.generate(6_000, PARTITIONS, 22)), seconds=14)
    fleet = run.start(2)
    eventually(lambda: len(run.observer.records) > 0, timeout_s=30)
    zombie = busiest_owner(run, fleet)
    zombie.pause()  # mid-merge, a transaction open: the other instance fences it and restores both inputs' offsets
    time.sleep(9)  # past session.timeout.ms (6 s)
    zombie.resume()
    time.sleep(2)
    FAULTS["sigterm"].inject(fleet, random.Random(22))
    outcome = run.finish()
    assert_exactly_once(outcome)
    fills_and_table_updates(outcome.verdict)
    assert "lost [" in zombie.log_path.read_text(), "the zombie never noticed it lost its partitions"
