"""What `python -m tools.bench.big_state` reports per key adds up (no broker; a few ms)."""

from __future__ import annotations

import sys

from pipeline.state import PartitionState
from tools.bench.big_state import MIB, accounting, key, summary, value


def test_the_object_accounting_counts_every_key_and_value_once() -> None:
    state = PartitionState()
    state.load({key(k): value(k) for k in range(1_000)})
    objects = accounting(state)
    assert objects["keys"] == 1_000 * sys.getsizeof(key(0))  # same length keys
    assert objects["values"] == sum(sys.getsizeof(value(k)) for k in range(1_000))
    assert objects["keys_blocks"] % 16 == 0 and objects["keys_blocks"] >= objects["keys"]
    assert objects["dict"] > 1_000 * 8


def test_the_summary_gives_the_median_run_and_memory_per_key() -> None:
    run = {
        "seconds": 10.0,
        "snapshot_s": 8.0,
        "tail_s": 2.0,
        "steps": 50,
        "longest_step_s": 0.3,
        "keys": 1_000_000,
        "snapshot_entries": 900_000,
        "changelog_records": 100_000,
        "rss_before": 30 * MIB,
        "rss_after": 230 * MIB,
        "rss_trimmed": 200 * MIB,
        "peak_rss": 250 * MIB,
        "objects": {
            "dict": 30_000_000,
            "keys": 65_000_000,
            "values": 44_000_000,
            "keys_blocks": 80_000_000,
            "values_blocks": 48_000_000,
        },
    }
    lines = summary([run, {**run, "seconds": 12.0}, {**run, "seconds": 30.0}])
    assert "median of 3: 12.0 s" in lines[0] and "every run 10.0 / 12.0 / 30.0 s" in lines[0]
    assert (
        "per key: RSS 210 B (trimmed 178 B), peak 231 B; objects 139 B (dict 30 + key 65 + value 44), "
        "in 16-byte blocks 158 B" in lines[2]
    )
