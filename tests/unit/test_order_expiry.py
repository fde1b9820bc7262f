"""pipeline/examples/order_expiry.py through the test driver (no broker): two co-partitioned inputs and an event-time
expiry per order (docs/guarantees.md: stream-time), held and orphan fills, late fills, state removed by TTL, and its
own check over generated input with aborts and crashes, red when the example is broken on purpose."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from pipeline.app import App, Output, Record, State, Timer
from pipeline.examples import order_expiry
from pipeline.examples.order_expiry import FILLS, FORGET_GRANULARITY_MS, FORGET_MS, ORDERS, ORPHAN_MS, app
from pipeline.testing.driver import AppDriver


def order(qty: int = 10, ttl_ms: int = 1_000) -> dict[str, Any]:
    return {"account": "acct-1", "qty": qty, "ttl_ms": ttl_ms}


def fill(fill_id: str, qty: int) -> dict[str, Any]:
    return {"fill_id": fill_id, "qty": qty, "price": 1.5}


def summary(outputs: Iterable[Any]) -> list[tuple[Any, ...]]:
    return [(o.value["fill_id"], o.value["filled"], o.value["remaining"], o.value["status"]) for o in outputs]


def letters(d: AppDriver) -> list[tuple[str, int, str]]:
    return [(letter.topic, letter.offset, letter.error_type) for letter in d.dead_letters]


def test_fills_count_and_the_last_one_fills_the_order_and_cancels_its_expiry() -> None:
    d = AppDriver(app)
    assert d.send("o1", order(10), topic=ORDERS, timestamp_ms=0) == []
    assert summary(d.send("o1", fill("f1", 4), topic=FILLS, timestamp_ms=10)) == [("f1", 4, 6, "open")]
    assert summary(d.send("o1", fill("f2", 6), topic=FILLS, timestamp_ms=20)) == [("f2", 10, 0, "filled")]
    assert d.send("o1", fill("f3", 1), topic=FILLS, timestamp_ms=30) == []  # the order is filled: late
    assert d.send("x", fill("other", 1), topic=FILLS, timestamp_ms=5_000) == []  # no expiry for o1
    assert letters(d) == [(FILLS, 2, "late_fill")] and d.verify().ok


def test_an_order_not_filled_expires_when_stream_time_of_either_input_reaches_its_due_time() -> None:
    d = AppDriver(app)
    d.send("o1", order(10, ttl_ms=1_000), topic=ORDERS, timestamp_ms=100)
    d.send("o1", fill("f1", 3), topic=FILLS, timestamp_ms=200)
    assert d.send("o2", order(5), topic=ORDERS, timestamp_ms=1_099) == []  # due at 1_100: not yet
    out = d.send("o3", order(5), topic=ORDERS, timestamp_ms=1_100)  # an order reaches it: expiry first
    assert summary(out) == [(None, 3, 7, "expired")] and out[0].key == "o1"
    assert out[0].timer is not None and out[0].timer.at_ms == 1_100
    assert d.send("o1", fill("f2", 1), topic=FILLS, timestamp_ms=1_101) == []
    assert letters(d) == [(FILLS, 1, "late_fill")] and d.verify().ok


def test_a_fill_after_the_due_time_is_late_the_expiry_fires_before_it() -> None:
    d = AppDriver(app)
    d.send("o1", order(10, ttl_ms=500), topic=ORDERS, timestamp_ms=0)
    assert summary(d.send("o1", fill("f1", 10), topic=FILLS, timestamp_ms=500)) == [(None, 0, 10, "expired")]
    assert letters(d) == [(FILLS, 0, "late_fill")] and d.verify().ok


def test_fills_before_their_order_are_held_and_released_in_fill_order_overfill_and_late_among_them() -> None:
    d = AppDriver(app)
    d.send("o1", fill("f1", 4), topic=FILLS, timestamp_ms=0)
    d.send("o1", fill("f2", 7), topic=FILLS, timestamp_ms=1)  # 11 > 10: an overfill when released
    d.send("o1", fill("f3", 6), topic=FILLS, timestamp_ms=2)  # fills the order
    d.send("o1", fill("f4", 1), topic=FILLS, timestamp_ms=3)  # after filled: late
    released = d.send("o1", order(10), topic=ORDERS, timestamp_ms=4)
    assert summary(released) == [("f1", 4, 6, "open"), ("f3", 10, 0, "filled")]
    assert letters(d) == [(FILLS, 1, "overfill"), (FILLS, 3, "late_fill")]
    assert d.timers() == [] and d.verify().ok


def test_a_held_fill_whose_order_never_comes_is_an_orphan_after_60_s_of_stream_time() -> None:
    d = AppDriver(app)
    d.send("o9", fill("f1", 1), topic=FILLS, timestamp_ms=1_000)
    d.send("o9", fill("f2", 1), topic=FILLS, timestamp_ms=30_000)
    d.send("o1", order(), topic=ORDERS, timestamp_ms=1_000 + ORPHAN_MS - 1)
    assert letters(d) == []
    d.send("o2", order(), topic=ORDERS, timestamp_ms=1_000 + ORPHAN_MS)  # f1's 60 s are over, f2's not
    assert letters(d) == [(FILLS, 0, "orphan_fill")]
    d.send("o3", order(), topic=ORDERS, timestamp_ms=30_000 + ORPHAN_MS)
    assert letters(d) == [(FILLS, 0, "orphan_fill"), (FILLS, 1, "orphan_fill")]
    assert "wait/o9" not in d.state() and d.verify().ok


def test_a_duplicate_order_and_malformed_records_are_dead_lettered() -> None:
    d = AppDriver(app)
    d.send("o1", order(), topic=ORDERS, timestamp_ms=0)
    d.send("o1", order(20), topic=ORDERS, timestamp_ms=1)
    d.send("o2", {"account": "a", "qty": 1}, topic=ORDERS, timestamp_ms=2)  # no ttl_ms
    d.send("o1", {"fill_id": "x", "qty": -1}, topic=FILLS, timestamp_ms=3)
    assert [e for _, _, e in letters(d)] == ["duplicate_order", "ValueError", "ValueError"]
    assert d.state()["order/o1"]["qty"] == 10 and d.verify().ok


def test_state_is_removed_300_s_of_stream_time_after_expiry_or_fill_rounded_up_to_a_minute_and_does_not_grow() -> None:
    # The last write's time + FORGET_MS, rounded up to FORGET_GRANULARITY_MS: never earlier, at most a minute later.
    assert (FORGET_MS, FORGET_GRANULARITY_MS) == (300_000, 60_000)
    d = AppDriver(app)
    d.send("filled", order(1), topic=ORDERS, timestamp_ms=0)
    d.send("filled", fill("f", 1), topic=FILLS, timestamp_ms=10)  # filled at 10: removed at 360 000
    d.send("expires", order(1, ttl_ms=100), topic=ORDERS, timestamp_ms=60_000)
    d.send("tick", fill("t", 1), topic=FILLS, timestamp_ms=60_100)  # expired at 60 100: removed at 420 000
    d.send("tick2", fill("t2", 1), topic=FILLS, timestamp_ms=10 + FORGET_MS)
    assert {"order/filled", "order/expires"} <= d.state().keys()
    d.send("tick3", fill("t3", 1), topic=FILLS, timestamp_ms=359_999)
    assert {"order/filled", "order/expires"} <= d.state().keys()
    d.send("tick4", fill("t4", 1), topic=FILLS, timestamp_ms=360_000)
    assert "order/filled" not in d.state() and "order/expires" in d.state()
    d.send("tick5", fill("t5", 1), topic=FILLS, timestamp_ms=419_999)
    assert "order/expires" in d.state()
    d.send("tick6", fill("t6", 1), topic=FILLS, timestamp_ms=420_000)
    assert not any(key.startswith("order/") for key in d.state())
    assert d.verify().ok


def test_an_open_order_with_a_ttl_above_the_state_ttl_is_kept_until_it_expires() -> None:
    d = AppDriver(app)
    d.send("long", order(5, ttl_ms=2 * FORGET_MS), topic=ORDERS, timestamp_ms=0)
    for ts in range(60_000, 2 * FORGET_MS, 60_000):
        d.send("tick", fill(f"t{ts}", 1), topic=FILLS, timestamp_ms=ts)
    assert d.state()["order/long"]["status"] == "open"
    out = d.send("tick", fill("last", 1), topic=FILLS, timestamp_ms=2 * FORGET_MS)
    assert summary(out) == [(None, 0, 5, "expired")]
    assert d.verify().ok


def feed(d: AppDriver, seed: int, records: int = 1_500, crash_every: int = 211) -> None:
    for i, (topic, p, key, value, ts) in enumerate(app.generate(records, d.partitions, seed)):
        decoded = orjson.loads(value) if value is not None else None
        d.produce(key.decode(), decoded, topic=topic, timestamp_ms=ts, partition=p)
        if i % 7 == 0:
            d.run()
        if i % crash_every == crash_every - 1:
            d.crash()
    d.run()


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_input_with_aborts_and_crashes_is_exactly_once_with_the_examples_properties(seed: int) -> None:
    d = AppDriver(app, partitions=3, test_abort_every=3)
    feed(d, seed, records=3_000)
    verdict = d.verify()
    assert verdict.ok, verdict.summary()
    statuses = {o.value["status"] for o in d.outputs}
    kinds = {letter.error_type for letter in d.dead_letters}
    assert statuses == {"open", "filled", "expired"}
    assert {"late_fill", "overfill", "duplicate_order", "orphan_fill", "ValueError"} <= kinds


def expiring_early(by_ms: int) -> App:
    """The example broken on purpose: orders expire `by_ms` before their due time."""

    def process(state: State, record: Record) -> Iterable[Output]:
        outputs = list(order_expiry.process(state, record))
        timer = state.timers.get(f"expire/{record.key}")
        if record.topic == ORDERS and timer is not None and record.value["ttl_ms"] > by_ms:
            state.timers.schedule(timer.key, timer.at_ms - by_ms)
        return outputs

    def on_timer(state: State, timer: Timer) -> Iterable[Output]:
        order = state.get(f"order/{timer.key.partition('/')[2]}")
        if order is not None and timer.key.startswith("expire/"):
            state[f"order/{timer.key.partition('/')[2]}"] = {**order, "due": timer.at_ms}
        return order_expiry.on_timer(state, timer)

    return dataclasses.replace(app, process=process, on_timer=on_timer)


def test_the_examples_check_finds_an_order_expired_before_its_due_time() -> None:
    """Red on purpose: the generic checker's reference expires early too (the App's own bug): its check finds it."""
    d = AppDriver(expiring_early(500), partitions=2)
    feed(d, 3, records=600)
    verdict = d.verify()
    assert verdict.duplicates.count == verdict.losses.count == 0
    assert any("not by its timer due at" in str(p) for p in verdict.app.samples), verdict.summary()


def test_the_examples_check_finds_an_output_after_expiry_and_a_wrong_fold() -> None:
    """Red on purpose: a fill accepted after its order expired (the status check) counted twice (the fold)."""

    def accepts_late(state: State, record: Record) -> Iterable[Output]:
        order = state.get(f"order/{record.key}")
        if record.topic == FILLS and order is not None and order["status"] == "expired":
            value = {**order, "status": "open", "filled": order["filled"] + 2 * record.value["qty"]}
            return [
                Output(
                    key=record.key,
                    value={
                        "order_id": record.key,
                        "fill_id": record.value["fill_id"],
                        **{k: value[k] for k in ("filled", "status")},
                        "remaining": 0,
                    },
                    partition=record.partition,
                )
            ]
        return order_expiry.process(state, record)

    d = AppDriver(dataclasses.replace(app, process=accepts_late), partitions=2)
    feed(d, 4, records=600)
    problems = [str(p) for p in d.verify().app.samples]
    assert any("after it was expired" in p for p in problems), problems
    assert any("the fold says" in p for p in problems), problems
