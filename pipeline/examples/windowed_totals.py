"""Windowed totals per account: tumbling windows of event time, one result per (account, window) once it closes.

Input as running_totals: key = account, value {"id": <int>, "amount": <int>}; event time = the record's Kafka
timestamp (ms). Windows [start, start + 10,000) are aligned to the epoch; grace 2,000 ms; stream time = the largest
timestamp seen in the input partition (`state.timers.stream_time_ms`).

- A record adds its amount to its (account, window): one state key `<account>@<window start>` = [count, sum]. The
  window's first record schedules a stream-time timer at window_end + grace under the same key.
- When stream time reaches window_end + grace the timer fires, before the record that moved stream time there:
  one output, key = account, value {"window_start", "window_end", "count", "sum"}; the window's key is deleted.
- A record whose window has closed already (window_end + grace <= stream time) is late: `Reject("late")` sends it
  to the dead-letter topic with error type `late`, uncounted.

No scan of the keys: each open window is one state key and one timer. Exactly once across crashes, zombies and
compaction because the timers are part of the state (docs/guarantees.md: timers-exactly-once).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator

import orjson

from pipeline.app import App, Output, Record, Reject, State, Timer
from pipeline.testing.inputs import account_partition

WINDOW_MS = 10_000
GRACE_MS = 2_000


def process(state: State, record: Record) -> Iterable[Output]:
    window_start = record.timestamp_ms - record.timestamp_ms % WINDOW_MS
    window_end = window_start + WINDOW_MS
    stream_time = state.timers.stream_time_ms
    if stream_time is not None and window_end + GRACE_MS <= stream_time:  # None: no timestamped record yet
        raise Reject(
            "late", f"window [{window_start}, {window_end}) of {record.key} closed at stream time {stream_time}"
        )
    amount = record.value["amount"]
    if not isinstance(amount, int):
        raise TypeError(f"amount must be an integer, got {amount!r}")
    key = f"{record.key}@{window_start}"
    count, total = state.get(key, (0, 0))
    if count == 0:
        state.timers.schedule(key, window_end + GRACE_MS)
    state[key] = (count + 1, total + amount)
    return ()


def on_timer(state: State, timer: Timer) -> Iterable[Output]:
    account, _, start = timer.key.rpartition("@")
    count, total = state.pop(timer.key)
    window_start = int(start)
    value = {"window_start": window_start, "window_end": window_start + WINDOW_MS, "count": count, "sum": total}
    return (Output(key=account, value=value),)


STEP_MS = 20  # event time advances this much per record
LATE_EVERY = 97  # about one record in LATE_EVERY arrives 13-30 s late (after its window closed)


def generate(
    n: int, partitions: int, seed: int = 0, accounts: int = 50, start_ms: int | None = None
) -> Iterator[tuple[int, bytes, bytes, int]]:
    """Record i: key "account-<k>", value {"id": i, "amount": <int>}, timestamp start_ms + i * STEP_MS, up to 1.5 s
    earlier (out of order, within the grace), or every LATE_EVERY-th on average 13-30 s earlier (late).

    start_ms (a window start) defaults to a recent one, so that the last record is stamped about now: the broker
    deletes records older than the topic's retention.ms by their timestamps, fixed old ones would vanish. The same
    arguments give the same records up to that shift of event time."""
    if start_ms is None:
        now = time.time_ns() // 1_000_000
        start_ms = now - now % WINDOW_MS - (n * STEP_MS // WINDOW_MS + 1) * WINDOW_MS
    rng = random.Random(seed)
    for i in range(n):
        key = f"account-{rng.randrange(accounts)}".encode()
        value = orjson.dumps({"id": i, "amount": rng.randint(-100, 1000)})
        behind = rng.randint(13_000, 30_000) if rng.randrange(LATE_EVERY) == 0 else rng.randint(0, 1_500)
        yield account_partition(key, partitions), key, value, start_ms + i * STEP_MS - behind


app = App(
    name="windowed-totals",
    input_topic="windowed-input",
    output_topic="windowed-output",
    process=process,
    on_timer=on_timer,
    generate=generate,
)
