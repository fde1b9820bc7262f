"""Running totals into PostgreSQL: the same `process` as pipeline/examples/running_totals.py, another sink.

Tables (in PIPELINE_POSTGRES_SCHEMA):
    outputs  one row per output, with the input coordinate (input_partition, input_offset) it came from. Deliberately
             NO unique constraint on the coordinate: the epoch fence, not a constraint, keeps duplicates out, and a
             duplicate would stay visible to the checker if the fence were broken.
    totals   one row per account: count and sum after the last record (the latest output per account of a batch).

    PIPELINE_SINK=postgres PIPELINE_POSTGRES_DSN=postgresql://... pipeline run pipeline.examples.running_totals_pg:app
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pipeline.app import Output
from pipeline.examples import running_totals
from pipeline.sinks.postgres.schema import Column, Table
from pipeline.sinks.postgres.tables import OutputRow, PostgresApp, StoredOutput, Target


class TotalsSink:
    OUTPUTS = Table(
        "outputs",
        (
            Column("row_id", "bigint", "GENERATED ALWAYS AS IDENTITY"),
            Column("input_partition", "integer", "NOT NULL"),
            Column("input_offset", "bigint", "NOT NULL"),
            Column("account", "text", "NOT NULL"),
            Column("id", "bigint", "NOT NULL"),
            Column("count", "bigint", "NOT NULL"),
            Column("sum", "bigint", "NOT NULL"),
        ),
        ("row_id",),  # a surrogate key only: nothing stops a second row for the same input coordinate
    )
    TOTALS = Table(
        "totals",
        (
            Column("account", "text", "NOT NULL"),
            Column("count", "bigint", "NOT NULL"),
            Column("sum", "bigint", "NOT NULL"),
        ),
        ("account",),
    )
    tables = (OUTPUTS, TOTALS)

    def write(self, cur: psycopg.Cursor, target: Target, rows: Sequence[OutputRow]) -> None:
        copy_sql = sql.SQL("COPY {} (input_partition, input_offset, account, id, count, sum) FROM STDIN")
        latest: dict[str, dict[str, Any]] = {}
        with cur.copy(copy_sql.format(target.table("outputs"))) as copy:
            for row in rows:
                value = row.output.value
                copy.write_row((row.partition, row.offset, row.output.key, value["id"], value["count"], value["sum"]))
                latest[row.output.key] = value
        upsert = sql.SQL(
            "INSERT INTO {} (account, count, sum) VALUES (%s, %s, %s) ON CONFLICT (account) "
            "DO UPDATE SET count = EXCLUDED.count, sum = EXCLUDED.sum"
        )
        cur.executemany(
            upsert.format(target.table("totals")), [(account, v["count"], v["sum"]) for account, v in latest.items()]
        )

    def read_back(self, conn: psycopg.Connection, target: Target) -> list[StoredOutput]:
        query = sql.SQL("SELECT row_id, input_partition, input_offset, account, id, count, sum FROM {}")
        return [
            StoredOutput(row_id, p, offset, Output(key=account, value={"id": id_, "count": count, "sum": total}))
            for row_id, p, offset, account, id_, count, total in conn.execute(query.format(target.table("outputs")))
        ]

    def check(self, conn: psycopg.Connection, target: Target, states: dict[int, dict[str, Any]]) -> list[str]:
        """`totals` must hold exactly the reference's final [count, sum] of every account."""
        expected = {account: tuple(value) for state in states.values() for account, value in state.items()}
        query = sql.SQL("SELECT account, count, sum FROM {}").format(target.table("totals"))
        actual = {account: (count, total) for account, count, total in conn.execute(query)}
        problems = [
            f"totals {a!r}: {actual.get(a)} != reference {expected.get(a)}"
            for a in sorted(actual.keys() | expected.keys())
            if actual.get(a) != expected.get(a)
        ]
        return problems


app = PostgresApp(
    name="running-totals-pg",
    input_topic="totals-input",
    output_topic="",  # no output topic: the outputs are rows
    process=running_totals.process,
    generate=running_totals.app.generate,
    postgres_sink=TotalsSink(),
)
