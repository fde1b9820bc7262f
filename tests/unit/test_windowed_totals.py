"""pipeline/examples/windowed_totals.py keeps the contract of issue 10 (checked from outside, through the test driver):
tumbling 10 s windows aligned to the epoch, grace 2 s, stream time per input partition; one output per (account,
window) once stream time >= window_end + grace; late records dead-lettered as `late`, uncounted."""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest

from pipeline.examples.windowed_totals import app
from pipeline.testing.driver import AppDriver

pytestmark = pytest.mark.usefixtures("state_store")  # every driver on both stores (tests/unit/conftest.py)


def test_a_window_closes_when_stream_time_reaches_its_end_plus_grace_and_not_before() -> None:
    driver = AppDriver(app)
    driver.send("a", {"id": 1, "amount": 5}, timestamp_ms=10_000)  # window [10000, 20000)
    driver.send("a", {"id": 2, "amount": 1}, timestamp_ms=25_000)  # stream time 25000 >= 22000: closes [10000, 20000)
    assert [o.value for o in driver.outputs] == [{"window_start": 10_000, "window_end": 20_000, "count": 1, "sum": 5}]
    assert driver.send("b", {"id": 3, "amount": 1}, timestamp_ms=31_999) == []  # [20000, 30000) due at 32000
    [out] = driver.send("b", {"id": 4, "amount": 1}, timestamp_ms=32_000)
    assert (out.key, out.value) == ("a", {"window_start": 20_000, "window_end": 30_000, "count": 1, "sum": 1})


def test_out_of_order_within_the_grace_counts_and_after_it_is_late() -> None:
    driver = AppDriver(app)
    driver.send("a", {"id": 1, "amount": 1}, timestamp_ms=5_000)
    driver.send("a", {"id": 2, "amount": 1}, timestamp_ms=11_999)  # stream time 11999: [0, 10000) still open
    driver.send("a", {"id": 3, "amount": 10}, timestamp_ms=9_999)  # out of order, within the grace: counted
    driver.send("a", {"id": 4, "amount": 1}, timestamp_ms=12_000)  # closes [0, 10000)
    driver.send("a", {"id": 5, "amount": 100}, timestamp_ms=0)  # late: not counted
    assert [o.value for o in driver.outputs] == [{"window_start": 0, "window_end": 10_000, "count": 2, "sum": 11}]
    [late] = driver.dead_letters
    assert (late.error_type, late.topic, late.partition, late.offset) == ("late", app.input_topic, 0, 4)
    assert driver.state() == {"a@10000": [2, 2]} and driver.verify().ok


def expected_windows(records: list[tuple[int, bytes, bytes, int]]) -> tuple[dict, int]:
    """The closed windows and the number of late records, computed here from the contract (not by the checker)."""
    stream: dict[int, int] = {}
    windows: dict[tuple[int, str, int], list[int]] = defaultdict(lambda: [0, 0])
    late = 0
    for p, key, value, ts in records:
        start = ts - ts % 10_000
        if p in stream and start + 12_000 <= stream[p]:
            late += 1
        else:
            window = windows[(p, key.decode(), start)]
            window[0] += 1
            window[1] += orjson.loads(value)["amount"]
        stream[p] = max(stream.get(p, ts), ts)
    closed = {(key, start): tuple(cs) for (p, key, start), cs in windows.items() if start + 12_000 <= stream[p]}
    return closed, late


def test_every_closed_window_exactly_once_with_its_count_and_sum_across_crashes() -> None:
    records = list(app.generate(4_000, 3, 7))
    driver = AppDriver(app, partitions=3, auto_commit=False)
    for i, (p, key, value, ts) in enumerate(records):
        driver.send_bytes(key, value, timestamp_ms=ts, partition=p)
        if i % 25 == 24:
            driver.commit()
        if i % 311 == 310:
            driver.crash()
    closed, late = expected_windows(records)
    got = [(o.key, o.value["window_start"], o.value["count"], o.value["sum"]) for o in driver.outputs]
    assert len(got) == len(closed) and sorted(got) == sorted((k, s, c, t) for (k, s), (c, t) in closed.items())
    assert late > 20 and len(driver.dead_letters) == late
    assert {d.error_type for d in driver.dead_letters} == {"late"}
    assert driver.verify().ok
