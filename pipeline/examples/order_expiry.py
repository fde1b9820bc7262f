"""Orders that expire when not filled in time: two co-partitioned inputs and an event-time timer per order.

Inputs (JSON values, string keys = the order id, the same partition count; event time = the Kafka timestamp):
    order-expiry-orders   {"account": str, "qty": int > 0, "ttl_ms": int > 0}
    order-expiry-fills    {"fill_id": str, "qty": int > 0, "price": number}
Output order-expiry-output, key = order id, in the input's partition:
    {"order_id", "fill_id", "filled", "remaining", "status"}
- an accepted fill: `fill_id` set, `filled` = the order's accepted fills so far, `remaining` = qty - filled, `status`
  "filled" when remaining reaches 0, else "open";
- when p's stream time (docs/guarantees.md: stream-time) reaches the order's timestamp + ttl_ms and the order is not
  filled: one output with `fill_id` null and `status` "expired" (a stream timer).
Dead letters: a fill for an order that expired or was filled: `late_fill`; a fill that would overfill: `overfill`;
a repeated order id: `duplicate_order`; a malformed record is poison. A fill before its order is held and released,
in fill order, when the order arrives (judged then as any fill: the order is open at its own time); a held fill
whose order has not come 60 s of stream time after p took it is dead-lettered `orphan_fill` (a timer).
An expired or filled order's state is removed 300 s of stream time later, or up to 60 s after that (state TTL,
deadlines rounded up to a minute): state does not grow with the number of orders ever seen. An order id seen
again after that is a new order.
"""

from __future__ import annotations

import heapq
import random
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from pipeline.app import App, Output, Record, Reject, State, Stream, Timer, dead_letter
from pipeline.core.deadletter import DeadLetter
from pipeline.core.provenance import decode_timer
from pipeline.testing.oracle.inputs import processing_order
from pipeline.testing.oracle.records import KafkaRecord, RunData
from pipeline.testing.oracle.verdict import Findings

ORDERS, FILLS, OUTPUT = "order-expiry-orders", "order-expiry-fills", "order-expiry-output"
ORPHAN_MS = 60_000  # a held fill waits this long (stream time) for its order
FORGET_MS = 300_000  # an expired or filled order's state stays this long (the App's state TTL)
# ... or up to this much longer: deadlines rounded up to a minute, so that an order's writes within the same minute
# (its placement, its fills, its expiry) write its TTL deadline entry once, not each time.
FORGET_GRANULARITY_MS = 60_000
# An open order is written again at least this often (stream time), so that the TTL, which counts from the last
# write, never removes an order still waiting for its expiry (a ttl_ms above FORGET_MS).
REFRESH_MS = 240_000


def process(state: State, record: Record) -> Iterable[Output]:
    order_id = record.key
    if not isinstance(order_id, str) or not order_id:
        raise ValueError(f"no order id (the key): {order_id!r}")
    if record.topic == ORDERS:
        return _order(state, order_id, record)
    return _fill(state, order_id, record)


def _order(state: State, order_id: str, record: Record) -> list[Output]:
    value = record.value
    if not (
        isinstance(value, dict)
        and isinstance(value.get("account"), str)
        and _positive(value.get("qty"))
        and _positive(value.get("ttl_ms"))
    ):
        raise ValueError(f"malformed order {value!r}: wants {{'account': str, 'qty': int > 0, 'ttl_ms': int > 0}}")
    if f"order/{order_id}" in state:
        raise Reject("duplicate_order", f"order {order_id} was placed already")
    due = record.timestamp_ms + value["ttl_ms"]
    order = {"qty": value["qty"], "filled": 0, "status": "open", "due": due, "partition": record.partition}
    outputs: list[Output] = []
    held = state.get(f"wait/{order_id}")  # get, not pop: no KeyError raised and caught for most orders
    if held:
        del state[f"wait/{order_id}"]
        state.timers.cancel(f"orphan/{order_id}")
    for fields, _ in held or ():  # fills that came first, in their order
        fill = Record(*fields)
        try:
            outputs.append(_accept(order, order_id, fill))
        except Reject as e:
            outputs.append(dead_letter(fill, e.error_type, str(e)))
    if order["status"] == "open":
        now = state.timers.stream_time_ms or record.timestamp_ms
        state.timers.schedule(f"expire/{order_id}", min(due, now + REFRESH_MS))
    state[f"order/{order_id}"] = order
    return outputs


def _fill(state: State, order_id: str, record: Record) -> list[Output]:
    if not _valid_fill(record.value):
        raise ValueError(f"malformed fill {record.value!r}: wants {{'fill_id': str, 'qty': int > 0, 'price': number}}")
    order = state.get(f"order/{order_id}")
    if order is None:  # before its order: held, for ORPHAN_MS of stream time at most
        taken_at = state.timers.stream_time_ms or record.timestamp_ms
        held = state.get(f"wait/{order_id}", [])
        if not held:
            state.timers.schedule(f"orphan/{order_id}", taken_at + ORPHAN_MS)
        state[f"wait/{order_id}"] = [*held, [list(record), taken_at]]
        return []
    output = _accept(order, order_id, record)  # raises Reject: late or overfill
    if order["status"] == "filled":
        state.timers.cancel(f"expire/{order_id}")
    state[f"order/{order_id}"] = order
    return [output]


def _accept(order: dict[str, Any], order_id: str, fill: Record) -> Output:
    """The output of an accepted fill (`order` counts it); Reject when the order is closed or would overfill."""
    fill_id, qty = fill.value["fill_id"], fill.value["qty"]
    if order["status"] != "open":
        raise Reject("late_fill", f"fill {fill_id}: order {order_id} is {order['status']}")
    if order["filled"] + qty > order["qty"]:
        raise Reject("overfill", f"fill {fill_id} of {qty} overfills {order['filled']} of {order['qty']}")
    order["filled"] += qty
    remaining = order["qty"] - order["filled"]
    order["status"] = "filled" if remaining == 0 else "open"
    return _output(order, order_id, fill_id)


def _output(order: dict[str, Any], order_id: str, fill_id: str | None) -> Output:
    value = {
        "order_id": order_id,
        "fill_id": fill_id,
        "filled": order["filled"],
        "remaining": order["qty"] - order["filled"],
        "status": order["status"],
    }
    return Output(key=order_id, value=value, partition=order["partition"])


def on_timer(state: State, timer: Timer) -> Iterable[Output]:
    kind, _, order_id = timer.key.partition("/")
    now = state.timers.stream_time_ms or timer.at_ms
    if kind == "orphan":
        return _orphans(state, order_id, now)
    order = state.get(f"order/{order_id}")
    if order is None or order["status"] != "open":
        return []
    if timer.at_ms < order["due"]:  # not due yet: written again, so that the TTL keeps it
        state.timers.schedule(timer.key, min(order["due"], now + REFRESH_MS))
        state[f"order/{order_id}"] = order
        return []
    order["status"] = "expired"
    state[f"order/{order_id}"] = order  # removed FORGET_MS after this write (state TTL)
    return [_output(order, order_id, None)]


def _orphans(state: State, order_id: str, now: int) -> list[Output]:
    """Held fills that waited ORPHAN_MS for their order: dead letters, in fill order; the rest wait on."""
    held = state.get(f"wait/{order_id}", [])
    expired = [fields for fields, taken_at in held if taken_at + ORPHAN_MS <= now]
    rest = [item for item in held if item[1] + ORPHAN_MS > now]
    if rest:
        state[f"wait/{order_id}"] = rest
        state.timers.schedule(f"orphan/{order_id}", rest[0][1] + ORPHAN_MS)
    elif held:
        del state[f"wait/{order_id}"]
    why = f"no order {order_id} within {ORPHAN_MS} ms of stream time"
    return [dead_letter(Record(*fields), "orphan_fill", why) for fields in expired]


def _positive(qty: object) -> bool:
    return isinstance(qty, int) and not isinstance(qty, bool) and qty > 0


def _valid_fill(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("fill_id"), str)
        and _positive(value.get("qty"))
        and isinstance(value.get("price"), int | float)
        and not isinstance(value.get("price"), bool)
    )


# -- sample input for `pipeline chaos` ------------------------------------------------------------------------------
STEP_MS = 250  # event time between two orders, on average
EARLY_MS = 500  # a fill before its order is at most this much earlier


Sample = tuple[str, int, bytes, bytes, int]  # (topic, partition, key, value, timestamp): one of Generated's shapes


def generate(n: int, partitions: int, seed: int, start_ms: int | None = None) -> Iterator[Sample]:
    """About n records in timestamp order: orders with ttl_ms of 2-20 s; their fills within 0.75 ttl, or for one
    order in five over 1.5 ttl (it expires, some fills are late); one order in six with a fill before it, one in
    eight overfilled, 2 % duplicate orders, 2 % orphan fills (no order ever), 1 % malformed fills. start_ms defaults
    to recent (brokers delete records older than retention by their timestamps)."""
    rng = random.Random(seed)
    if start_ms is None:
        start_ms = time.time_ns() // 1_000_000 - (n // 3) * STEP_MS - 600_000
    events: list[tuple[int, int, Sample]] = []  # a heap: (timestamp, sequence, record)
    written, number, ts = 0, 0, start_ms
    while written < n:
        number += 1
        ts += rng.randint(1, 2 * STEP_MS)
        for at, item in _order_events(rng, f"o-{seed}-{number}", partitions, ts):
            heapq.heappush(events, (at, written, item))
            written += 1
        while events and events[0][0] < ts - EARLY_MS:  # no later order has a record this early: out in order
            yield heapq.heappop(events)[2]
    while events:
        yield heapq.heappop(events)[2]


def _order_events(rng: random.Random, order_id: str, partitions: int, ts: int) -> Iterator[tuple[int, Sample]]:
    p, key = zlib.crc32(order_id.encode()) % partitions, order_id.encode()
    qty, ttl = rng.randint(5, 50), rng.randint(2_000, 20_000)
    orphan = rng.random() < 0.02
    if not orphan:
        order = orjson.dumps({"account": f"acct-{rng.randrange(20)}", "qty": qty, "ttl_ms": ttl})
        yield ts, (ORDERS, p, key, order, ts)
        if rng.random() < 0.02:  # the same order id again, later
            again = ts + rng.randint(1, ttl)
            yield again, (ORDERS, p, key, order, again)
    left = qty + (rng.randint(1, 10) if rng.random() < 0.125 else 0)
    fills, slow = 0, rng.random() < 0.2  # a slow order's fills spread past its due time: it expires, some are late
    span = ttl * 3 // 2 if slow else ttl * 3 // 4
    while left > 0:
        fills += 1
        take = min(left, rng.randint(1, max(1, qty // 2)))
        left -= take
        at = ts + rng.randint(0, span)
        if fills == 1 and rng.random() < 0.17:
            at = ts - rng.randint(1, EARLY_MS)  # before its order: held
        value = orjson.dumps({"fill_id": f"{order_id}-f{fills}", "qty": take, "price": round(rng.uniform(1, 2), 4)})
        if rng.random() < 0.01:
            value = b'{"fill_id": "bad", "qty": -1}'
        yield at, (FILLS, p, key, value, at)


# -- the example's own properties (App.check): `pipeline verify`, chaos and the driver's verify run them -----------
def check(run: RunData) -> list[str]:
    """Every fill exactly once as an output or a dead letter (one held at the end of the run may still wait); each
    order at most one "expired" and no output after it, nor after "filled"; filled/remaining/status as the fold of its
    accepted fills in the fills' order; no expiry before its due time by the stream time of the records processed
    before it, in the run's recorded merge order."""
    order = processing_order(app, run, Findings())
    outputs = sorted(run.outputs.records, key=lambda r: r.coord)
    orders = _orders(run)
    return _fills_once(run, order, outputs) + _folds(run, orders, outputs) + _expiries(order, orders, outputs)


def _orders(run: RunData) -> dict[str, tuple[int, int]]:
    """order id -> (qty, due ms) of its first valid order record."""
    orders: dict[str, tuple[int, int]] = {}
    for record in sorted(run.inputs.records, key=lambda r: r.coord):
        value = _json(record.value)
        if isinstance(value, dict) and _positive(value.get("qty")) and _positive(value.get("ttl_ms")):
            orders.setdefault(_key(record), (value["qty"], record.timestamp_ms + value["ttl_ms"]))
    return orders


def _fills_once(run: RunData, order: dict[int, list[tuple[int, KafkaRecord]]], outputs: list[KafkaRecord]) -> list[str]:
    seen: dict[str, int] = {}
    for out in outputs:
        if (fill_id := _json(out.value)["fill_id"]) is not None:
            seen[fill_id] = seen.get(fill_id, 0) + 1
    for record in run.dead_letters.records:
        letter = DeadLetter.from_record(record.key, record.value, list(record.headers))
        if _valid_fill(value := _json(letter.value)):
            seen[value["fill_id"]] = seen.get(value["fill_id"], 0) + 1
    problems = [f"fill {f}: output or dead-lettered {n} times" for f, n in seen.items() if n > 1]
    for taken in order.values():
        stream_time, waiting = -1, dict[str, list[tuple[str, int]]]()
        for i, record in taken:
            stream_time = max(stream_time, record.timestamp_ms)
            value = _json(record.value)
            if i == 0:
                if isinstance(value, dict) and _positive(value.get("qty")) and _positive(value.get("ttl_ms")):
                    waiting.pop(_key(record), None)  # its order came: the held fills are released
            elif _valid_fill(value) and value["fill_id"] not in seen:
                waiting.setdefault(_key(record), []).append((value["fill_id"], stream_time))
        may_wait = {f for fills in waiting.values() for f, at in fills if at + ORPHAN_MS > stream_time}
        lost = [f for fills in waiting.values() for f, _ in fills if f not in may_wait]
        problems += [f"fill {f}: neither output nor dead-lettered" for f in lost]
    return problems


def _folds(run: RunData, orders: dict[str, tuple[int, int]], outputs: list[KafkaRecord]) -> list[str]:
    fills = {}
    for record in run.more_inputs[FILLS].records:
        if _valid_fill(value := _json(record.value)):
            fills[value["fill_id"]] = (record.offset, value["qty"])
    problems: list[str] = []
    state: dict[str, tuple[int, int, str]] = {}  # order id -> (filled, last fill offset, status)
    for out in outputs:
        value, where = _json(out.value), f"out {out.partition}@{out.offset}"
        order_id = value["order_id"]
        filled, last, status = state.get(order_id, (0, -1, "open"))
        if status != "open":
            problems.append(f"{where}: order {order_id} output after it was {status}")
        if value["fill_id"] is not None:
            offset, qty = fills.get(value["fill_id"], (-1, 0))
            if offset <= last:
                problems.append(f"{where}: fill {value['fill_id']} of order {order_id} out of the fills' order")
            filled, last = filled + qty, offset
        qty = orders.get(order_id, (0, 0))[0]
        want = "expired" if value["fill_id"] is None else ("filled" if filled == qty else "open")
        if (value["filled"], value["remaining"], value["status"]) != (filled, qty - filled, want):
            got = (value["filled"], value["remaining"], value["status"])
            fold = (filled, qty - filled, want)
            problems.append(f"{where}: order {order_id} filled/remaining/status {got}, the fold says {fold}")
        state[order_id] = (filled, last, want)
    return problems


def _expiries(
    order: dict[int, list[tuple[int, KafkaRecord]]], orders: dict[str, tuple[int, int]], outputs: list[KafkaRecord]
) -> list[str]:
    """An expiry fires before the record at its position (records taken before it, eos.timer): stream time there is
    the largest timestamp up to and including that record, which must have reached the order's due time."""
    stream_times: dict[int, list[int]] = {}
    for p, taken in order.items():
        stream_times[p], now = [], -1
        for _, record in taken:
            now = max(now, record.timestamp_ms)
            stream_times[p].append(now)
    problems = []
    for out in outputs:
        value = _json(out.value)
        if value["status"] != "expired":
            continue
        firing, due = decode_timer(out.headers), orders.get(value["order_id"], (0, -1))[1]
        where = f"out {out.partition}@{out.offset}: order {value['order_id']} expired"
        if firing is None or firing.at_ms != due:
            problems.append(f"{where} by {firing}, not by its timer due at {due}")
        elif firing.position >= len(times := stream_times.get(firing.partition, [])) or times[firing.position] < due:
            seen = times[firing.position] if firing.position < len(times) else None
            problems.append(f"{where} at stream time {seen}, before it was due at {due}")
    return problems


def _key(record: KafkaRecord) -> str:
    return (record.key or b"").decode()


def _json(value: bytes | None) -> Any:
    try:
        return orjson.loads(value or b"null")
    except orjson.JSONDecodeError:
        return None


app = App(
    name="order-expiry",
    inputs=[Stream(ORDERS), Stream(FILLS)],
    output_topic=OUTPUT,
    process=process,
    on_timer=on_timer,
    state_ttl_ms=FORGET_MS,
    state_ttl_granularity_ms=FORGET_GRANULARITY_MS,
    generate=generate,
    check=check,
)
