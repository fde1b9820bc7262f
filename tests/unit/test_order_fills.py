"""pipeline/examples/order_fills.py through the test driver (no broker): orders and fills, two co-partitioned inputs,
the accounts global table, held fills, overfills and duplicates, and the checker over generated input with aborts
and crashes (docs/inputs.md)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from pipeline.app import Output
from pipeline.examples import order_fills
from pipeline.examples.order_fills import ACCOUNTS, FILLS, ORDERS, app
from pipeline.testing.driver import AppDriver


def fill(fill_id: str, qty: int, price: float = 1.5) -> dict:
    return {"fill_id": fill_id, "qty": qty, "price": price}


def driver(**settings) -> AppDriver:
    d = AppDriver(app, **settings)
    d.update_table("accounts", "acct-1", {"desk": "rates", "version": 1})
    return d


def test_a_fill_after_its_order_is_output_with_the_accounts_desk() -> None:
    d = driver()
    assert d.send("o1", {"account": "acct-1", "qty": 10}, topic=ORDERS) == []
    [out] = d.send("o1", fill("f1", 4), topic=FILLS)
    assert out.value == {
        "order_id": "o1",
        "fill_id": "f1",
        "account": "acct-1",
        "desk": "rates",
        "desk_version": 1,
        "filled": 4,
        "remaining": 6,
    }
    assert out.key == "o1" and out.source == (0, 0, 1)  # fills are the second input


def test_fills_before_their_order_wait_and_are_released_in_fill_order() -> None:
    d = driver()
    assert d.send("o1", fill("f1", 3), topic=FILLS) == []
    assert d.send("o1", fill("f2", 2), topic=FILLS) == []
    released = d.send("o1", {"account": "acct-1", "qty": 10}, topic=ORDERS)
    assert [(o.value["fill_id"], o.value["filled"], o.value["remaining"]) for o in released] == [
        ("f1", 3, 7),
        ("f2", 5, 5),
    ]
    assert {o.source for o in released} == {(0, 0)}  # produced while the order was processed
    assert d.verify().ok


def test_an_overfill_is_dead_lettered_live_or_held_and_not_counted() -> None:
    d = driver()
    d.send("o1", fill("early", 12), topic=FILLS)  # held: the order comes later, and it overfills then
    assert d.send("o1", {"account": "acct-1", "qty": 10}, topic=ORDERS) == []
    [ok] = d.send("o1", fill("f2", 10), topic=FILLS)
    assert d.send("o1", fill("f3", 1), topic=FILLS) == []  # live: rejected at once
    assert ok.value["filled"] == 10
    letters = {(letter.topic, letter.offset): letter.error_type for letter in d.dead_letters}
    assert letters == {(FILLS, 0): "overfill", (FILLS, 2): "overfill"}  # each under its own coordinates
    assert d.verify().ok


def test_a_second_order_with_the_same_id_and_malformed_records_are_dead_lettered() -> None:
    d = driver()
    d.send("o1", {"account": "acct-1", "qty": 10}, topic=ORDERS)
    d.send("o1", {"account": "acct-1", "qty": 20}, topic=ORDERS)
    d.send("o2", {"account": 7, "qty": 1}, topic=ORDERS)
    d.send("o1", {"fill_id": "x", "qty": -1}, topic=FILLS)
    assert sorted(letter.error_type for letter in d.dead_letters) == ["ValueError", "ValueError", "duplicate_order"]
    assert d.state()["order/o1"]["qty"] == 10
    assert d.verify().ok


def test_desk_is_the_tables_value_when_the_output_is_produced() -> None:
    d = driver()
    d.send("o1", {"account": "acct-1", "qty": 10}, topic=ORDERS)
    d.send("o2", {"account": "acct-9", "qty": 10}, topic=ORDERS)
    [first] = d.send("o1", fill("f1", 1), topic=FILLS)
    d.update_table("accounts", "acct-1", {"desk": "credit", "version": 2})
    [second] = d.send("o1", fill("f2", 1), topic=FILLS)
    [unknown] = d.send("o2", fill("f3", 1), topic=FILLS)
    assert [(o.value["desk"], o.value["desk_version"]) for o in (first, second, unknown)] == [
        ("rates", 1),
        ("credit", 2),
        (None, 0),
    ]


def test_records_waiting_together_are_taken_in_timestamp_order() -> None:
    d = driver()
    d.produce("o1", fill("f1", 1), topic=FILLS, timestamp_ms=20)
    d.produce("o1", {"account": "acct-1", "qty": 5}, topic=ORDERS, timestamp_ms=10)
    [out] = d.run()
    assert out.source == (0, 0, 1)  # the order went first: the fill was not held, its own output
    assert d.verify().ok


def test_held_fills_survive_a_crash() -> None:
    d = driver(auto_commit=True)
    d.send("o1", fill("f1", 2), topic=FILLS)
    d.crash()
    [out] = d.send("o1", {"account": "acct-1", "qty": 5}, topic=ORDERS)
    assert out.value["fill_id"] == "f1"
    assert d.verify().ok


def feed(d: AppDriver, seed: int, records: int = 600) -> None:
    for i, (topic, p, key, value, ts) in enumerate(app.generate(records, d.partitions, seed)):
        decoded = None if value is None else orjson.loads(value) if value[:1] == b"{" else value
        if topic == ACCOUNTS:
            d.update_table("accounts", key.decode(), decoded, timestamp_ms=ts)
        else:
            d.produce(key.decode(), decoded, topic=topic, timestamp_ms=ts, partition=p)
        if i % 7 == 0:
            d.run()
        if i % 101 == 0:
            d.crash()
    d.run()


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_input_with_aborts_and_crashes_is_exactly_once_with_the_examples_properties(seed: int) -> None:
    d = AppDriver(app, partitions=3, test_abort_every=3)
    feed(d, seed)
    verdict = d.verify()
    assert verdict.ok, verdict.summary()
    assert len(d.outputs) > 300 and any(letter.error_type == "overfill" for letter in d.dead_letters)


def test_the_examples_check_finds_a_fill_output_twice() -> None:
    """Red on purpose: an order that outputs its released fills twice. The generic checker's reference makes the
    same outputs (the App's own bug, not a lost or doubled transaction): the example's own check finds it."""

    def twice(state, record):
        outputs = list(order_fills.process(state, record))
        if record.topic == ORDERS:
            outputs += [Output(key=o.key, value=o.value, partition=o.partition) for o in outputs]
        return outputs

    d = AppDriver(dataclasses.replace(app, process=twice), partitions=3)
    feed(d, 3, records=300)
    verdict = d.verify()
    assert not verdict.ok and verdict.duplicates.count == 0
    assert any("output or dead-lettered 2 times" in str(p) for p in verdict.app.samples)


def test_the_examples_check_finds_a_desk_version_going_back() -> None:
    """Red on purpose: outputs that read the table's first version after a newer one was used."""
    first_seen: dict[str, dict] = {}

    def stale(state, record):
        outputs = list(order_fills.process(state, record))
        for o in outputs:
            key = o.value["account"]
            if key in first_seen and first_seen[key]["desk_version"] < o.value["desk_version"]:
                continue
            first_seen.setdefault(key, dict(o.value))
        return [
            Output(key=o.key, partition=o.partition, value={**o.value, "desk_version": 5 - o.value["desk_version"]})
            for o in outputs
        ]

    d = AppDriver(dataclasses.replace(app, process=stale), partitions=2)
    feed(d, 4, records=300)
    verdict = d.verify()
    assert any("went back" in str(p) or "never written" in str(p) for p in verdict.app.samples), verdict.summary()
