"""Orders and their fills, two co-partitioned streams, enriched with the account's desk from a global table.

Inputs (JSON values, string keys = the order id, the same partition count):
    order-fills-orders   {"account": str, "qty": int > 0}
    order-fills-fills    {"fill_id": str, "qty": int > 0, "price": number}
Global table order-fills-accounts (compacted): key = account, value {"desk": str, "version": int}.
Output order-fills-output, key = order id, one record per accepted fill, in the partition of its input:
    {"order_id", "fill_id", "account", "desk", "desk_version", "filled", "remaining"}
`filled` sums the order's accepted fills up to this one, in the fills' partition order; `remaining` = qty - filled.
A fill that would overfill its order is dead-lettered ("overfill") and not counted; a second order with an id
already seen is dead-lettered ("duplicate_order"); a malformed record is poison. A fill that arrives before its
order waits in state and is released, in fill order, when the order arrives. `desk`/`desk_version` are the
accounts table's value when the output is produced (null and 0 for an account not in it).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from pipeline.app import App, Generated, Output, Record, Reject, State, Stream, Table, dead_letter
from pipeline.core.deadletter import DeadLetter
from pipeline.testing.oracle.records import RunData

ORDERS, FILLS, ACCOUNTS, OUTPUT = (
    "order-fills-orders",
    "order-fills-fills",
    "order-fills-accounts",
    "order-fills-output",
)


def process(state: State, record: Record) -> Iterable[Output]:
    order_id = record.key
    if not isinstance(order_id, str) or not order_id:
        raise ValueError(f"no order id (the key): {order_id!r}")
    if record.topic == ORDERS:
        return _order(state, order_id, record)
    return _fill(state, order_id, record)


def _order(state: State, order_id: str, record: Record) -> list[Output]:
    value = record.value
    if not (isinstance(value, dict) and isinstance(value.get("account"), str) and _positive(value.get("qty"))):
        raise ValueError(f"malformed order {value!r}: wants {{'account': str, 'qty': int > 0}}")
    if f"order/{order_id}" in state:
        raise Reject("duplicate_order", f"order {order_id} was placed already")
    order = {"account": value["account"], "qty": value["qty"], "filled": 0}
    outputs = []
    for fields in state.pop(f"wait/{order_id}", []):  # fills that came first, in their order
        held = Record(*fields)
        output = _accept(state, order, order_id, held)
        outputs.append(output if output is not None else dead_letter(held, "overfill", _overfill(order, held)))
    state[f"order/{order_id}"] = order
    return outputs


def _fill(state: State, order_id: str, record: Record) -> list[Output]:
    value = record.value
    if not _valid_fill(value):
        raise ValueError(f"malformed fill {value!r}: wants {{'fill_id': str, 'qty': int > 0, 'price': number}}")
    order = state.get(f"order/{order_id}")
    if order is None:  # before its order: held until the order arrives
        state[f"wait/{order_id}"] = [*state.get(f"wait/{order_id}", []), list(record)]
        return []
    output = _accept(state, order, order_id, record)
    if output is None:
        raise Reject("overfill", _overfill(order, record))
    state[f"order/{order_id}"] = order
    return [output]


def _accept(state: State, order: dict[str, Any], order_id: str, fill: Record) -> Output | None:
    """The output of an accepted fill (`order` counts it), or None when it would overfill the order."""
    qty = fill.value["qty"]
    if order["filled"] + qty > order["qty"]:
        return None
    order["filled"] += qty
    account = state.tables["accounts"].get(order["account"]) or {}
    return Output(
        key=order_id,
        partition=fill.partition,  # the fills' partition: an account's desk_version never goes back within it
        value={
            "order_id": order_id,
            "fill_id": fill.value["fill_id"],
            "account": order["account"],
            "desk": account.get("desk"),
            "desk_version": account.get("version", 0),
            "filled": order["filled"],
            "remaining": order["qty"] - order["filled"],
        },
    )


def _overfill(order: dict[str, Any], fill: Record) -> str:
    return f"fill {fill.value['fill_id']} of {fill.value['qty']} overfills {order['filled']} of {order['qty']}"


def _positive(qty: object) -> bool:
    return isinstance(qty, int) and not isinstance(qty, bool) and qty > 0


# -- sample input for `pipeline chaos` ------------------------------------------------------------------------------
def generate(n: int, partitions: int, seed: int) -> Iterator[Generated]:
    """About n records: orders, fills (about one in six before its order, some overfilling, a few malformed), a
    duplicate order now and then, and account updates (a new desk version) throughout."""
    rng = random.Random(seed)
    accounts = [f"acct-{i}" for i in range(20)]
    versions = dict.fromkeys(accounts, 0)
    ts = 1_700_000_000_000
    written = 0
    for account in accounts:  # every account in the table once before the first order
        versions[account] += 1
        yield (ACCOUNTS, _partition(account, partitions), account.encode(), _desk(account, versions), ts)
        written += 1
    order_number = 0
    while written < n:
        order_number += 1
        ts += rng.randint(1, 5)
        batch = list(_order_records(rng, f"o-{seed}-{order_number}", rng.choice(accounts), partitions, ts))
        if rng.random() < 0.1:
            account = rng.choice(accounts)
            versions[account] += 1
            batch.append((ACCOUNTS, _partition(account, partitions), account.encode(), _desk(account, versions), ts))
        for item in batch:
            yield item
            written += 1
        ts += len(batch) * 3


def _order_records(rng: random.Random, order_id: str, account: str, partitions: int, ts: int) -> Iterator[Generated]:
    p, key = _partition(order_id, partitions), order_id.encode()
    qty = rng.randint(5, 50)
    order = (ORDERS, p, key, orjson.dumps({"account": account, "qty": qty}), ts)
    fills: list[tuple[str, int, bytes, bytes, int]] = []
    left = qty + (rng.randint(1, 10) if rng.random() < 0.15 else 0)  # sometimes more than the order: an overfill
    number = 0
    while left > 0:
        number += 1
        take = min(left, rng.randint(1, max(1, qty // 2)))
        left -= take
        value = orjson.dumps({"fill_id": f"{order_id}-f{number}", "qty": take, "price": round(rng.uniform(1, 2), 4)})
        if rng.random() < 0.01:
            value = b'{"fill_id": "bad", "qty": -1}'  # malformed: poison
        fills.append((FILLS, p, key, value, ts + 2 * number))
    if rng.random() < 0.17:  # the first fill before its order
        first = fills.pop(0)
        yield (FILLS, p, key, first[3], ts - 1)
    yield order
    yield from fills
    if rng.random() < 0.02:  # the same order id again
        yield (ORDERS, p, key, orjson.dumps({"account": account, "qty": qty}), ts + 2 * number + 1)


def _partition(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def _desk(account: str, versions: dict[str, int]) -> bytes:
    return orjson.dumps(
        {"desk": f"desk-{zlib.crc32(account.encode()) % 4}-v{versions[account]}", "version": versions[account]}
    )


# -- the example's own properties, checked by `pipeline verify` beside the generic checks (App.check) ------------------
def check(run: RunData) -> list[str]:
    """Every fill output once or dead-lettered once (a fill whose order never came may still wait); `filled` and
    `remaining` as the offline fold in the fills' partition order; every (desk, desk_version) written to the table
    for that account; within an output partition an account's desk_version never decreases."""
    outputs = [orjson.loads(r.value or b"null") for r in sorted(run.outputs.records, key=lambda r: r.coord)]
    letters = [DeadLetter.from_record(r.key, r.value, list(r.headers)) for r in run.dead_letters.records]
    problems = _fills_once(run, outputs, letters) + _filled_as_folded(run, outputs)
    return problems + _desks_written(run, outputs) + _versions_forward(run)


def _fills_once(run: RunData, outputs: list[Any], letters: list[DeadLetter]) -> list[str]:
    seen: dict[str, int] = {}
    for out in outputs:
        seen[out["fill_id"]] = seen.get(out["fill_id"], 0) + 1
    for letter in letters:
        if _valid_fill(value := _json(letter.value)):  # an order has no fill_id
            seen[value["fill_id"]] = seen.get(value["fill_id"], 0) + 1
    problems = [f"fill {f}: output or dead-lettered {n} times" for f, n in seen.items() if n > 1]
    waiting = _expected(run)[1]
    for record in run.more_inputs[FILLS].records:
        value = _json(record.value)
        if _valid_fill(value) and value["fill_id"] not in seen and value["fill_id"] not in waiting:
            problems.append(f"fill {value['fill_id']}: neither output nor dead-lettered")
    return problems


def _filled_as_folded(run: RunData, outputs: list[Any]) -> list[str]:
    expected = _expected(run)[0]
    return [
        f"fill {out['fill_id']}: filled/remaining {out['filled']}/{out['remaining']}, the fold says {want}"
        for out in outputs
        if (want := expected.get(out["fill_id"])) != (out["filled"], out["remaining"])
    ]


def _expected(run: RunData) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """fill id -> (filled, remaining) of each accepted fill, folded offline in the fills' partition order; and the
    fills whose order never came (they wait)."""
    qty: dict[str, int] = {}
    for record in sorted(run.inputs.records, key=lambda r: r.coord):
        value = _json(record.value)
        if isinstance(value, dict) and _positive(value.get("qty")) and isinstance(value.get("account"), str):
            qty.setdefault((record.key or b"").decode(), value["qty"])
    filled: dict[str, int] = {}
    accepted, waiting = {}, set()
    for record in sorted(run.more_inputs[FILLS].records, key=lambda r: r.coord):
        order_id, value = (record.key or b"").decode(), _json(record.value)
        if not _valid_fill(value):
            continue
        if order_id not in qty:
            waiting.add(value["fill_id"])
        elif filled.get(order_id, 0) + value["qty"] <= qty[order_id]:
            filled[order_id] = filled.get(order_id, 0) + value["qty"]
            accepted[value["fill_id"]] = (filled[order_id], qty[order_id] - filled[order_id])
    return accepted, waiting


def _desks_written(run: RunData, outputs: list[Any]) -> list[str]:
    written: set[tuple[str, Any, Any]] = set()
    for record in run.global_tables["accounts"].records:
        value = _json(record.value)
        if isinstance(value, dict):
            written.add(((record.key or b"").decode(), value.get("desk"), value.get("version")))
    return [
        f"fill {out['fill_id']}: desk {out['desk']!r} version {out['desk_version']} never written for {out['account']}"
        for out in outputs
        if (out["desk"], out["desk_version"]) != (None, 0)  # an account not (yet) in the table
        and (out["account"], out["desk"], out["desk_version"]) not in written
    ]


def _versions_forward(run: RunData) -> list[str]:
    problems, last = [], dict[tuple[int, str], int]()
    for record in sorted(run.outputs.records, key=lambda r: r.coord):
        out = _json(record.value)
        lane = (record.partition, out["account"])
        if out["desk_version"] < last.get(lane, 0):
            problems.append(f"out {record.partition}@{record.offset}: {out['account']} desk_version went back")
        last[lane] = max(last.get(lane, 0), out["desk_version"])
    return problems


def _json(value: bytes | None) -> Any:
    try:
        return orjson.loads(value or b"null")
    except orjson.JSONDecodeError:
        return None


def _valid_fill(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("fill_id"), str)
        and _positive(value.get("qty"))
        and isinstance(value.get("price"), int | float)
        and not isinstance(value.get("price"), bool)
    )


app = App(
    name="order-fills",
    inputs=[Stream(ORDERS), Stream(FILLS)],
    output_topic=OUTPUT,
    process=process,
    global_tables={"accounts": Table(ACCOUNTS)},
    generate=generate,
    check=check,
)
