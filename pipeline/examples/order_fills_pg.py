"""Orders and their fills into PostgreSQL: the same `process` as pipeline/examples/order_fills.py (two co-partitioned
inputs merged in timestamp order, a global table of accounts), another sink.

Tables (in PIPELINE_POSTGRES_SCHEMA):
    fills   one row per accepted fill, with the input coordinate it came from (input_partition, input_offset,
            input_index: 0 orders, 1 fills; a fill held until its order came is written with the order's record).
            Deliberately NO unique constraint on the coordinate or the fill id: the epoch fence, not a constraint,
            keeps duplicates out, and a duplicate would stay visible to the checker if the fence were broken.
    orders  one row per order with an accepted fill: filled and remaining after the last one
Dead letters (overfill, duplicate_order, poison) are rows of pipeline_dead_letters; the order taken, rows of
pipeline_merge_order (the checker replays it).

    PIPELINE_SINK=postgres PIPELINE_POSTGRES_DSN=postgresql://... pipeline run pipeline.examples.order_fills_pg:app
    pipeline verify pipeline.examples.order_fills_pg:app --sink postgres
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pipeline.app import Output
from pipeline.examples import order_fills
from pipeline.sinks.postgres.schema import Column, Table
from pipeline.sinks.postgres.tables import OutputRow, PostgresApp, StoredOutput, Target

# The output's fields, in the order `process` writes them: the checker compares encoded values.
FIELDS = ("order_id", "fill_id", "account", "desk", "desk_version", "filled", "remaining")


class FillsSink:
    FILLS = Table(
        "fills",
        (
            Column("row_id", "bigint", "GENERATED ALWAYS AS IDENTITY"),
            Column("input_partition", "integer", "NOT NULL"),
            Column("input_offset", "bigint", "NOT NULL"),
            Column("input_index", "integer", "NOT NULL"),
            Column("order_id", "text", "NOT NULL"),
            Column("fill_id", "text", "NOT NULL"),
            Column("account", "text", "NOT NULL"),
            Column("desk", "text"),  # null: the account is not in the accounts table (yet)
            Column("desk_version", "integer", "NOT NULL"),
            Column("filled", "bigint", "NOT NULL"),
            Column("remaining", "bigint", "NOT NULL"),
        ),
        ("row_id",),  # a surrogate key only: nothing stops a second row for the same fill
    )
    ORDERS = Table(
        "orders",
        (
            Column("order_id", "text", "NOT NULL"),
            Column("filled", "bigint", "NOT NULL"),
            Column("remaining", "bigint", "NOT NULL"),
        ),
        ("order_id",),
    )
    tables = (FILLS, ORDERS)

    def write(self, cur: psycopg.Cursor, target: Target, rows: Sequence[OutputRow]) -> None:
        columns = ("input_partition", "input_offset", "input_index", *FIELDS[:2], *FIELDS[2:])
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
            target.table(self.FILLS.name), sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        latest: dict[str, dict[str, Any]] = {}
        with cur.copy(copy_sql) as copy:
            for row in rows:
                value = row.output.value
                copy.write_row((row.partition, row.offset, row.index, *(value[f] for f in FIELDS)))
                latest[value["order_id"]] = value
        upsert = sql.SQL(
            "INSERT INTO {} (order_id, filled, remaining) VALUES (%s, %s, %s) ON CONFLICT (order_id) "
            "DO UPDATE SET filled = EXCLUDED.filled, remaining = EXCLUDED.remaining"
        )
        cur.executemany(
            upsert.format(target.table(self.ORDERS.name)),
            [(order_id, v["filled"], v["remaining"]) for order_id, v in latest.items()],
        )

    def read_back(self, conn: psycopg.Connection, target: Target) -> list[StoredOutput]:
        query = sql.SQL("SELECT row_id, input_partition, input_offset, input_index, {} FROM {}").format(
            sql.SQL(", ").join(map(sql.Identifier, FIELDS)), target.table(self.FILLS.name)
        )
        return [
            # The output's partition is the fill's (order_fills._accept): the input partition p.
            StoredOutput(
                row_id,
                p,
                offset,
                Output(key=values[0], value=dict(zip(FIELDS, values, strict=True)), partition=p),
                index,
            )
            for row_id, p, offset, index, *values in conn.execute(query)
        ]

    def check(self, conn: psycopg.Connection, target: Target, states: dict[int, dict[str, Any]]) -> list[str]:
        """`orders` must hold exactly the reference's final filled/remaining of every order with an accepted fill."""
        expected = {
            key.removeprefix("order/"): (order["filled"], order["qty"] - order["filled"])
            for state in states.values()
            for key, order in state.items()
            if key.startswith("order/") and order["filled"] > 0
        }
        query = sql.SQL("SELECT order_id, filled, remaining FROM {}").format(target.table(self.ORDERS.name))
        actual = {order_id: (filled, remaining) for order_id, filled, remaining in conn.execute(query)}
        return [
            f"orders {o!r}: {actual.get(o)} != reference {expected.get(o)}"
            for o in sorted(actual.keys() | expected.keys())
            if actual.get(o) != expected.get(o)
        ]


app = PostgresApp(
    name="order-fills-pg",
    inputs=order_fills.app.streams,
    output_topic="",  # no output topic: the outputs are rows
    process=order_fills.process,
    global_tables=order_fills.app.global_table_specs,
    generate=order_fills.generate,
    check=order_fills.check,
    postgres_sink=FillsSink(),
)
