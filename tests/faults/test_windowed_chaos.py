"""windowed_totals under every process fault of `pipeline chaos`, CI-sized (docs/guarantees.md: timers-exactly-once):
every closed window exactly once with the right count and sum, late records dead-lettered exactly once, by the
checker's verdict.

Each fault gets one run built from the chaos command's own parts (`FaultRun`: fresh topics, two pipeline
processes, paced input, catch-up, the checker; `FAULTS[...]`: the fault itself, with its environment), smaller
than `pipeline chaos --profile ci` (20,000 records over 12 s, two strikes at seeded moments): 8,000 records over 4 s
(~780 windows, ~75 late records) and one strike. The input starts once both instances run their partitions
(restored), and the strike comes once the first window has closed in committed output (~0.5 s into the input), so
it lands while windows are open and closing (one every ~0.25 s at this pace) whatever the machine's load. With input
fed from the start instead, a loaded run (the fresh changelog's end offsets unknown for 5 s) found it all piled up,
processed it in two transactions per partition and never aborted one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from pipeline.examples import windowed_totals
from pipeline.testing import chaos, faults
from pipeline.testing.harness import Fleet, Instance, group_owners
from tests.faults.conftest import PARTITIONS
from tests.support import eventually

WINDOWED = "pipeline.examples.windowed_totals:app"
RECORDS, SECONDS, SEED = 8_000, 4.0, 28


@pytest.fixture(scope="module")
def records() -> list:
    return list(windowed_totals.generate(RECORDS, PARTITIONS, SEED))


def run_with_fault(fault: faults.Fault, records: list, bootstrap: str, log_dir: Path) -> tuple[faults.Outcome, str]:
    """The outcome and every instance's whole log."""
    run = faults.FaultRun(windowed_totals.app, WINDOWED, bootstrap, PARTITIONS, log_dir, dict(fault.env))
    try:
        fleet = run.start(2)
        eventually(lambda: ready(run, fleet), timeout_s=60, interval_s=0.2)
        run.feed(records, SECONDS)
        eventually(lambda: len(run.observer.records) > 0, timeout_s=60)  # a window closed and committed
        fault.inject(fleet, random.Random(f"{SEED}-{fault.name}"))
        return run.finish(), "\n".join(log(instance) for instance in fleet.instances)
    finally:
        run.abandon()


def ready(run: faults.FaultRun, fleet: Fleet) -> bool:
    """Every partition owned by a live instance whose log says it restored it (a fresh changelog's end offsets can
    take seconds to be known on a loaded broker: owned is not running yet)."""
    try:
        owners = group_owners(run.bootstrap, run.app_id)
    except KafkaException:  # the group does not exist yet
        return False
    alive = {instance.name: instance for instance in fleet.alive}
    owned = sorted(p for owned in owners.values() for p in owned)
    return owned == list(range(PARTITIONS)) and all(
        name in alive and all(f"p{p} restored" in log(alive[name]) for p in partitions)
        for name, partitions in owners.items()
    )


def log(instance: Instance) -> str:
    try:
        return instance.log_path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("fault", faults.PROCESS_FAULTS)
def test_windowed_totals_under_chaos_every_window_exactly_once(fault, records, kafka_bootstrap, tmp_path):
    outcome, logs = run_with_fault(faults.FAULTS[fault], records, kafka_bootstrap, tmp_path)
    row = chaos.report([(faults.FAULTS[fault], outcome, 0.0)]).splitlines()[-1]
    print(row)  # with -s: the chaos command's row for this fault
    assert outcome.verdict is not None, f"did not catch up: {row}\n{outcome.logs[-4000:]}"
    assert outcome.ok, f"{row}\n{outcome.verdict.summary()}\n{outcome.logs[-4000:]}"
    verdict = outcome.verdict
    timer_outputs = sum(1 for out in verdict.final_outputs if any(name == "eos.timer" for name, _ in out.headers))
    assert verdict.outputs == timer_outputs > 500, row  # every output is a closed window, from its timer
    assert verdict.dead_letters > 40, row  # the late records
    if fault == "aborts":
        assert "injected abort" in logs, "no transaction was aborted: the run proved nothing"
