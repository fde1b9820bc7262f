"""Running totals whose state changes shape between two deploys: v1 keeps [count, sum], v2 {"count", "sum"} and
migrates v1 values. Outputs are the same in both, so a run that switches versions half-way checks against v2.
Run by the pipeline processes of tests/snapshots/test_snapshot_versions.py; the unit tests use it too."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pipeline.app import App, Output, Record, State


def process_v1(state: State, record: Record) -> Iterable[Output]:
    count, total = state.get(record.key, (0, 0))
    state[record.key] = (count + 1, total + record.value["amount"])
    return (
        Output(
            key=record.key, value={"id": record.value["id"], "count": count + 1, "sum": total + record.value["amount"]}
        ),
    )


def process_v2(state: State, record: Record) -> Iterable[Output]:
    totals = state.get(record.key, {"count": 0, "sum": 0})
    totals = {"count": totals["count"] + 1, "sum": totals["sum"] + record.value["amount"]}
    state[record.key] = totals
    return (Output(key=record.key, value={"id": record.value["id"], **totals}),)


def migrate(version: int, value: Any) -> Any:
    count, total = value  # version 1: [count, sum]
    return {"count": count, "sum": total}


v1 = App(name="versioned", input_topic="versioned-input", output_topic="versioned-output", process=process_v1)
v2 = replace(v1, process=process_v2, state_version=2, migrate=migrate)
