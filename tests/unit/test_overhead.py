"""The broker-free overhead measurement runs the real hot path: every record processed, every output produced."""

from __future__ import annotations

import pytest

from pipeline.examples import copier, running_totals
from tools.bench import overhead


@pytest.mark.parametrize("app", [copier.app, running_totals.app], ids=["copier", "running_totals"])
def test_overhead_processes_every_record_into_one_output(app) -> None:
    result = overhead.measure(app, records=3_000, passes=1)
    assert result.records == 3_000
    assert result.produced == 3_000  # one output per record in both examples: nothing skipped or doubled
    assert result.us_per_record > 0
