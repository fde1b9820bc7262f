"""Fault runs (pipeline.testing.faults.FaultRun): fresh topics, paced input, real pipeline processes, the checker's
verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.loading import load_app
from pipeline.testing.faults import FaultRun, Outcome
from pipeline.testing.harness import Fleet, Instance, group_owners
from tests.support import eventually

PARTITIONS = 3


@pytest.fixture
def fault_run(kafka_bootstrap: str, tmp_path: Path) -> Iterator:
    runs: list[FaultRun] = []

    def make(app_spec: str = "pipeline.examples.running_totals:app", **env: str) -> FaultRun:
        run = FaultRun(
            load_app(app_spec),
            app_spec,
            kafka_bootstrap,
            PARTITIONS,
            tmp_path / "logs",
            {f"PIPELINE_{k.upper()}": str(v) for k, v in env.items()},
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.abandon()


def assert_exactly_once(outcome: Outcome) -> None:
    assert outcome.verdict is not None, f"did not catch up, lag per partition {outcome.stuck}\n{outcome.logs}"
    assert not outcome.phantoms, f"a read_committed observer saw records the final drain lacks: {outcome.phantoms[:5]}"
    assert outcome.verdict.ok, outcome.verdict.summary() + "\n" + outcome.logs
    assert not outcome.exited, "instances exited by themselves:\n" + "\n".join(outcome.exited)


def busiest_owner(run: FaultRun, fleet: Fleet) -> Instance:
    """Once both instances own partitions, the one owning the most: the one to make a zombie or to kill. Picking the
    first started instead made a zombie of an instance that, on a loaded machine, had not joined yet (it was paused
    owning nothing, and the test proved nothing)."""

    def both_own() -> dict[str, list[int]] | None:
        owners = group_owners(run.bootstrap, run.app_id)
        return owners if len(owners) == 2 and all(owners.values()) else None

    owners = eventually(both_own, timeout_s=60, interval_s=0.2)
    busiest = max(owners, key=lambda name: len(owners[name]))
    return next(i for i in fleet.alive if i.name == busiest)
