"""Fault runs (pipeline.testing.faults.FaultRun): fresh topics, paced input, real pipeline processes, the checker's
verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.loading import load_app
from pipeline.testing.faults import FaultRun, Outcome

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
