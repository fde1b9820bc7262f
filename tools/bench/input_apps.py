"""The Apps `python -m tools.bench.inputs` measures (docs/inputs.md), importable by a `pipeline run` process.

one             the copier on one input (bytes in, the same bytes out, stateless)
two             the same with two co-partitioned inputs merged by timestamp
table_lookup    one input and a co-partitioned table: each record looks up a key of the table
global_lookup   one input and a global table: each record looks up a key of the table

A lookup's key is the record's offset modulo LOOKUP_KEYS, so every lookup finds a value (the tables are filled with
keys k0 .. k<LOOKUP_KEYS-1> first). Every output is the input's value unchanged: its first 8 bytes are the produce
time stamped by the benchmark's producer (tools/bench/latency.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipeline.app import App, Output, Record, State, Stream, Table
from pipeline.serde import BYTES, JSON, STRING

LOOKUP_KEYS = 10_000
A, B, OUT, TABLE, GLOBAL = "bench-inputs-a", "bench-inputs-b", "bench-inputs-out", "bench-inputs-t", "bench-inputs-g"


def copy(state: State, record: Record) -> Iterable[Output]:
    return [Output(key=record.key, value=record.value, partition=record.partition)]


def lookup(name: str) -> Callable[[State, Record], Iterable[Output]]:
    def process(state: State, record: Record) -> Iterable[Output]:
        found = state.tables[name].get(f"k{record.offset % LOOKUP_KEYS}")
        if found is None:
            raise ValueError(f"k{record.offset % LOOKUP_KEYS} is not in table {name}")
        return [Output(key=record.key, value=record.value, partition=record.partition)]

    return process


def _stream(topic: str) -> Stream:
    return Stream(topic, BYTES, BYTES)


one = App(
    name="bench-one",
    inputs=[_stream(A)],
    output_topic=OUT,
    process=copy,
    stateful=False,
    output_key_serde=BYTES,
    output_value_serde=BYTES,
)
two = App(
    name="bench-two",
    inputs=[_stream(A), _stream(B)],
    output_topic=OUT,
    process=copy,
    stateful=False,
    output_key_serde=BYTES,
    output_value_serde=BYTES,
)
table_lookup = App(
    name="bench-table",
    inputs=[_stream(A)],
    tables={"t": Table(TABLE, STRING, JSON)},
    output_topic=OUT,
    process=lookup("t"),
    output_key_serde=BYTES,
    output_value_serde=BYTES,
)
global_lookup = App(
    name="bench-global",
    inputs=[_stream(A)],
    global_tables={"g": Table(GLOBAL, STRING, JSON)},
    output_topic=OUT,
    process=lookup("g"),
    stateful=False,
    output_key_serde=BYTES,
    output_value_serde=BYTES,
)
