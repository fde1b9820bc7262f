"""The input of `python -m tools.bench.timers` keeps what its figures claim: after the first window, every partition
holds between 1x and 2x its accounts' open windows at every record, and the windows closed by the end are
expected_windows (checked with the broker-free driver, the same task code as the runner; a few ms)."""

from __future__ import annotations

from pipeline.examples import windowed_totals
from pipeline.testing.driver import AppDriver
from tools.bench.timers import expected_windows, open_window_records

ACCOUNTS, PARTITIONS = 60, 3


def test_the_bench_input_keeps_between_one_and_two_windows_open_per_account() -> None:
    records = list(open_window_records(5 * ACCOUNTS, ACCOUNTS, PARTITIONS))
    driver = AppDriver(windowed_totals.app, partitions=PARTITIONS)
    accounts = {p: {key for part, key, _, _ in records if part == p} for p in range(PARTITIONS)}
    steady: list[tuple[int, int]] = []  # (open windows of the partition, its accounts) after each record
    for i, (partition, key, value, timestamp) in enumerate(records):
        driver.send_bytes(key, value, timestamp_ms=timestamp, partition=partition)
        if i >= ACCOUNTS:  # from the second window on
            steady.append((len(driver.timers(partition)), len(accounts[partition])))
    assert all(n <= pending <= 2 * n for pending, n in steady), steady
    assert len(driver.outputs) == expected_windows(len(records), ACCOUNTS) == 3 * ACCOUNTS
    assert not driver.dead_letters  # nothing late
