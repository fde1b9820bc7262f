"""Test app for the PostgreSQL sink with a co-partitioned table: positions per account against a table of limits
(one input stream, one co-partitioned table), through the default sink (pipeline_outputs, with input_index). Its
`generate` interleaves trades and limit updates by timestamp, so a take-over's restore reads the table ahead of the
trades processed again (docs/guarantees.md: table-reads-forward) and the checker must load it where the transaction
began."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Iterator

import orjson

from pipeline.app import Generated, Output, Record, Reject, State, Stream, Table
from pipeline.sinks.postgres.tables import PostgresApp

TRADES, LIMITS = "pg-limits-trades", "pg-limits-limits"


def process(state: State, record: Record) -> Iterable[Output]:
    limit = state.tables["limits"].get(record.key)
    position = state.get(record.key, 0) + record.value["qty"]
    if limit is not None and position > limit:
        raise Reject("over_limit", f"{record.key}: {position} > {limit}")
    state[record.key] = position
    return [Output(key=record.key, value={"position": position, "limit": limit})]  # pipeline_outputs keeps no partition


def generate(n: int, partitions: int, seed: int) -> Iterator[Generated]:
    rng = random.Random(seed)
    accounts = [f"acct-{i}" for i in range(30)]
    ts = 1_700_000_000_000
    for _ in range(n):
        ts += rng.randint(1, 3)
        account = rng.choice(accounts)
        p, key = zlib.crc32(account.encode()) % partitions, account.encode()
        if rng.random() < 0.15:
            yield (LIMITS, p, key, orjson.dumps(rng.randint(100, 2_000)), ts)
        else:
            yield (TRADES, p, key, orjson.dumps({"qty": rng.randint(1, 5)}), ts)


app = PostgresApp(
    name="pg-limits",
    inputs=[Stream(TRADES)],
    tables={"limits": Table(LIMITS)},
    output_topic="",
    process=process,
    generate=generate,
)
