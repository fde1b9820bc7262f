"""`python -m tools.bench.serde`: what exact decimals cost per record, JSON vs JsonSerde(decimal=True).

One order-like record (an id, an account, a price, a quantity, a side), serialised and deserialised in a loop; the
best of 5 repeats, in microseconds per call, with the load average (the machine is shared).
"""

from __future__ import annotations

import os
import timeit
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pipeline.serde import JSON, JsonSerde

CALLS = 200_000


def per_call_us(fn: Callable[[], Any]) -> float:
    return min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6


def main() -> None:
    exact = JsonSerde(decimal=True)
    as_float = {"id": 123456, "account": "acct-0042", "price": 101.25, "qty": 3, "side": "buy"}
    as_decimal = {**as_float, "price": Decimal("101.25")}
    float_bytes, decimal_bytes = JSON.serialize(as_float), exact.serialize(as_decimal)
    rows = [
        ("serialize", per_call_us(lambda: JSON.serialize(as_float)), per_call_us(lambda: exact.serialize(as_decimal))),
        (
            "deserialize",
            per_call_us(lambda: JSON.deserialize(float_bytes)),
            per_call_us(lambda: exact.deserialize(decimal_bytes)),
        ),
    ]
    print(f"{'':12} {'JSON us':>8} {'decimal us':>10} {'ratio':>6}   (load {os.getloadavg()[0]:.2f})")
    for name, plain, decimal in rows:
        print(f"{name:12} {plain:8.2f} {decimal:10.2f} {decimal / plain:6.1f}x")


if __name__ == "__main__":
    main()
