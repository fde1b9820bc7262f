"""Running totals per account.

Input: key = account id, value = {"id": <unique id>, "amount": <int>}.
Output (same key): {"id", "count", "sum"} after this record. State per account: [count, sum].
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.app import App, Output, Record, State
from pipeline.testing.inputs import running_totals_records


def process(state: State, record: Record) -> Iterable[Output]:
    amount = record.value["amount"]
    if not isinstance(amount, int):
        raise TypeError(f"amount must be an integer, got {amount!r}")
    count, total = state.get(record.key, (0, 0))
    count, total = count + 1, total + amount
    state[record.key] = (count, total)
    return (Output(key=record.key, value={"id": record.value["id"], "count": count, "sum": total}),)


app = App(
    name="running-totals",
    input_topic="totals-input",
    output_topic="totals-output",
    process=process,
    generate=lambda n, partitions, seed: running_totals_records(n, partitions=partitions, seed=seed),
)
