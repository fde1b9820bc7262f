"""windowed_totals under every process fault of `pipeline chaos`, CI-sized (docs/guarantees.md: timers-exactly-once):
every closed window exactly once with the right count and sum, late records dead-lettered exactly once, by the
checker's verdict.

Each fault gets one run built from the chaos command's own parts (`chaos.FaultRun`: fresh topics, two pipeline
processes, paced input, catch-up, the checker; `chaos.FAULTS[...]`: the fault itself, with its environment), smaller
than `pipeline chaos --profile ci` (20,000 records over 12 s, two strikes at seeded moments): 8,000 records over 6 s
(~780 windows, ~75 late records) and one strike, made once the first window has closed in committed output, so it
lands while windows are open and closing (one closes every ~0.3 s of wall time at this pace) whatever the machine's
load, never on a fleet still starting.
"""

from __future__ import annotations

import random

import pytest

from pipeline.examples import windowed_totals
from pipeline.testing import chaos
from tests.faults.conftest import PARTITIONS
from tests.support import eventually

WINDOWED = "pipeline.examples.windowed_totals:app"
RECORDS, SECONDS, SEED = 8_000, 6.0, 28


@pytest.fixture(scope="module")
def records() -> list:
    return list(windowed_totals.generate(RECORDS, PARTITIONS, SEED))


def run_with_fault(fault: chaos.Fault, records: list, bootstrap: str, log_dir) -> chaos.Outcome:
    run = chaos.FaultRun(windowed_totals.app, WINDOWED, bootstrap, PARTITIONS, log_dir, dict(fault.env))
    try:
        run.feed(records, SECONDS)
        fleet = run.start(2)
        eventually(lambda: len(run.observer.records) > 0, timeout_s=60)  # a window closed and committed
        fault.inject(fleet, random.Random(f"{SEED}-{fault.name}"))
        return run.finish()
    finally:
        run.abandon()


@pytest.mark.parametrize("fault", chaos.PROCESS_FAULTS)
def test_windowed_totals_under_chaos_every_window_exactly_once(fault, records, kafka_bootstrap, tmp_path):
    outcome = run_with_fault(chaos.FAULTS[fault], records, kafka_bootstrap, tmp_path)
    row = chaos.report([(chaos.FAULTS[fault], outcome, 0.0)]).splitlines()[-1]
    print(row)  # with -s: the chaos command's row for this fault
    assert outcome.verdict is not None, f"did not catch up: {row}\n{outcome.logs[-4000:]}"
    assert outcome.ok, f"{row}\n{outcome.verdict.summary()}\n{outcome.logs[-4000:]}"
    verdict = outcome.verdict
    timer_outputs = sum(1 for out in verdict.final_outputs if any(name == "eos.timer" for name, _ in out.headers))
    assert verdict.outputs == timer_outputs > 500, row  # every output is a closed window, from its timer
    assert verdict.dead_letters > 40, row  # the late records
