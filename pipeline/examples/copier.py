"""Copies every input record to the output topic unchanged, to the same partition number. Stateless."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.app import App, Output, Record, State
from pipeline.serde import BYTES
from pipeline.testing.inputs import copier_records


def process(state: State, record: Record) -> Iterable[Output]:
    return (Output(key=record.key, value=record.value, partition=record.partition),)


app = App(
    name="copier",
    input_topic="copier-input",
    output_topic="copier-output",
    process=process,
    key_serde=BYTES,
    value_serde=BYTES,
    output_key_serde=BYTES,
    output_value_serde=BYTES,
    stateful=False,
    generate=lambda n, partitions, seed: copier_records(n, partitions=partitions, seed=seed),
)
