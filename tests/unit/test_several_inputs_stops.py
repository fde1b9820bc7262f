"""A partition of an App with several inputs stopped mid-transaction (docs/guarantees.md: fail-fast): the runtime
commits what came before the record that stopped it, and the checkpoint of that commit must name in its merge order
exactly the records its offsets cover. The stopped record is not among them: it is processed again by the next owner,
in the next transaction's order. Through the test driver (its stop is the runner's: commit, then stop)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from pipeline.app import App, Output, Record, State, Timer
from pipeline.state.changelog import Checkpoint, is_checkpoint, order_runs
from pipeline.testing.driver import AppDriver

ORDERS, FILLS = "stops-orders", "stops-fills"


def counting(state: State, record: Record) -> Any:
    """Counts the records of each key; returns None (a CodeError: p stops) for the value "bad"."""
    if record.value == "bad":
        return None
    state[record.key] = state.get(record.key, 0) + 1
    return [Output(key=record.key, value=f"{record.topic}:{record.value}", partition=record.partition)]


def failing(state: State, record: Record) -> Iterable[Output]:
    """Raises for "bad": poison, which ON_POISON=stop stops at after its attempts."""
    if record.value == "bad":
        raise ValueError("bad record")
    return fixed(state, record)


def fixed(state: State, record: Record) -> Iterable[Output]:
    state[record.key] = state.get(record.key, 0) + 1
    return [Output(key=record.key, value=f"{record.topic}:{record.value}", partition=record.partition)]


def two_inputs(process: Any) -> App:
    return App(name="stops", inputs=[ORDERS, FILLS], output_topic="stops-out", process=process)


def checkpoints(d: AppDriver) -> list[Checkpoint]:
    return [
        Checkpoint.decode(r.value)
        for r in d.broker.committed_records(d.changelog_topic)
        if is_checkpoint(r.key, list(r.headers))
    ]


def order_agrees_with_offsets(d: AppDriver) -> None:
    """Each checkpoint's order takes, from each topic, as many records as its offsets moved past since the one before
    it: what the checker's replay relies on."""
    before: dict[str, int] = {}
    topics = d.app.co_partitioned
    for checkpoint in checkpoints(d):
        taken = dict.fromkeys(topics, 0)
        for index, count in order_runs(checkpoint.order):
            taken[topics[index]] += count
        moved = {t: (checkpoint.offsets.get(t) or 0) - before.get(t, 0) for t in topics}
        assert taken == moved, f"checkpoint {checkpoint}: its order takes {taken}, its offsets moved {moved}"
        before = {t: checkpoint.offsets.get(t) or 0 for t in topics}


@pytest.mark.parametrize(
    ("process", "settings"),
    [(counting, {}), (failing, {"on_poison": "stop"}), (failing, {"dead_letter_storm": 1})],
    ids=["code_error", "on_poison_stop", "dead_letter_storm"],
)
def test_a_stop_mid_transaction_commits_a_checkpoint_whose_order_names_only_what_its_offsets_cover(
    process: Any, settings: dict[str, Any]
) -> None:
    d = AppDriver(two_inputs(process), on_stop="record", max_task_idle_ms=-1, **settings)
    d.produce("o1", "order", topic=ORDERS, timestamp_ms=10)
    d.produce("o1", "fill", topic=FILLS, timestamp_ms=20)
    d.produce("o2", "bad", topic=ORDERS, timestamp_ms=30)  # taken third, in the same transaction: p stops there
    d.produce("o2", "late", topic=FILLS, timestamp_ms=40)
    d.run()
    assert d.stopped.keys() == {0}
    assert [o.value for o in d.outputs] == ["stops-orders:order", "stops-fills:fill"]  # what came before: committed
    assert checkpoints(d)[-1].offsets == {ORDERS: 1, FILLS: 1}
    order_agrees_with_offsets(d)
    d.deploy(two_inputs(fixed))  # the fix takes over from the stopped record
    assert d.stopped == {}
    assert [o.value for o in d.outputs][2:] == ["stops-orders:bad", "stops-fills:late"]
    order_agrees_with_offsets(d)
    assert d.verify().ok, d.verify().summary()


def timing(state: State, record: Record) -> Any:
    """As `counting`, and each order schedules a stream timer at 25."""
    return None if record.value == "bad" else timing_fixed(state, record)


def timing_fixed(state: State, record: Record) -> Iterable[Output]:
    if record.topic == ORDERS:
        state.timers.schedule(record.key, 25)
    return fixed(state, record)


def timer_fired(state: State, timer: Timer) -> Iterable[Output]:
    return [Output(key=timer.key, value=f"timer:{timer.at_ms}")]


def test_a_timer_fired_before_the_stopping_record_is_committed_at_its_position_and_replayed_there() -> None:
    """The timer due at 25 fires before the record at 30 that stops p, at position 2 (two records taken): committed
    with them, and __eos.taken says 2, so the next owner's firings and the checker's replay count from there."""
    app = App(name="stops", inputs=[ORDERS, FILLS], output_topic="stops-out", process=timing, on_timer=timer_fired)
    d = AppDriver(app, on_stop="record", max_task_idle_ms=-1)
    d.produce("o1", "order", topic=ORDERS, timestamp_ms=10)
    d.produce("o1", "fill", topic=FILLS, timestamp_ms=20)
    d.produce("o2", "bad", topic=ORDERS, timestamp_ms=30)
    d.run()
    assert [o.value for o in d.outputs] == ["stops-orders:order", "stops-fills:fill", "timer:25"]
    assert d.outputs[-1].timer is not None and d.outputs[-1].timer.position == 2
    assert d.tasks[0].state.taken == 2  # committed: the stopped record is not counted taken
    order_agrees_with_offsets(d)
    d.deploy(replace(app, process=timing_fixed))
    assert [o.value for o in d.outputs][3:] == ["stops-orders:bad"]
    order_agrees_with_offsets(d)
    assert d.verify().ok, d.verify().summary()
