"""How an App's outputs become rows: a `TableSink`.

The user API does not change: `process(state, record)` returns `Output`s. In the PostgreSQL mode each batch's outputs,
with the input coordinate each came from, are handed to the sink's `write` inside the batch's database transaction
(the same one that advances p's offset row and writes p's state). A sink names its tables (created on start-up when
missing, checked when present) and can read its rows back as `Output`s for the checker.

An App picks its sink by being a `PostgresApp` (an App with a `postgres_sink`); any other App gets `BytesOutputs`,
which stores each output's serialised key and value in `pipeline_outputs`. Write with COPY or executemany (psycopg
prepares statements that repeat), never one round trip per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg import sql

from pipeline.app import App, Output
from pipeline.settings import ConfigError, Settings
from pipeline.sinks.postgres.schema import INPUT_INDEX, Column, Table


def refuse_unfit(app: App, settings: Settings) -> None:
    """ConfigError for an App this sink cannot run; `pipeline run` asks before it contacts any broker."""
    if settings.sink != "postgres":
        raise ConfigError(f"PostgresRunner needs SINK=postgres, not {settings.sink!r}")
    if app.extended_state:  # its state rows have no place for them (docs/guarantees.md: timers-exactly-once)
        raise ConfigError(
            f"{app.name}: timers, state TTL and state versions (on_timer, state_ttl_ms, "
            "state_version) are Kafka-mode only; SINK=postgres cannot run this App"
        )


@dataclass(frozen=True, slots=True)
class OutputRow:
    """One output and the input record it came from: `index` says which of the App's inputs (0: the first, the only
    one of a one-input App), as the source header of the Kafka sink does (pipeline/core/provenance.py)."""

    partition: int
    offset: int
    output: Output
    index: int = 0


@dataclass(frozen=True, slots=True)
class StoredOutput:
    """An output read back from the sink's tables; `order` is the order rows were written in (e.g. an identity)."""

    order: int
    partition: int
    offset: int
    output: Output
    index: int = 0


@dataclass(frozen=True)
class Target:
    """Where a sink writes: the schema, and which app and input topic the rows belong to."""

    schema: str
    app: App
    app_id: str
    input_topic: str

    def table(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic task p reads partition p of: the input (as renamed), then the App's other inputs and its
        co-partitioned tables (docs/inputs.md)."""
        return (self.input_topic, *self.app.co_partitioned[1:])


class TableSink(Protocol):
    @property
    def tables(self) -> Sequence[Table]: ...  # read-only: a sink may keep them in a tuple

    def write(self, cur: psycopg.Cursor, target: Target, rows: Sequence[OutputRow]) -> None:
        """Writes one batch. Runs inside the batch's transaction: raise to roll the whole batch back."""

    def read_back(self, conn: psycopg.Connection, target: Target) -> list[StoredOutput]:
        """Every output row of this app, as the Output it was written from (for the checker)."""

    def check(self, conn: psycopg.Connection, target: Target, states: dict[int, dict[str, Any]]) -> list[str]:
        """Problems of derived tables against the reference states (decoded, per input partition); [] if none."""


def sink_of(app: App) -> TableSink:
    return getattr(app, "postgres_sink", None) or BytesOutputs()


class BytesOutputs:
    """The default sink: every output's key and value as the App's output serdes encode them."""

    TABLE = Table(
        "pipeline_outputs",
        (
            Column("row_id", "bigint", "GENERATED ALWAYS AS IDENTITY"),
            Column("app_id", "text", "NOT NULL"),
            Column("input_partition", "integer", "NOT NULL"),
            Column("input_offset", "bigint", "NOT NULL"),
            Column("key", "bytea"),
            Column("value", "bytea"),
            INPUT_INDEX,  # added by the framework's migration 2 to a table created before
        ),
        ("row_id",),
    )
    tables = (TABLE,)

    def write(self, cur: psycopg.Cursor, target: Target, rows: Sequence[OutputRow]) -> None:
        app = target.app
        statement = sql.SQL("COPY {} (app_id, input_partition, input_offset, key, value, input_index) FROM STDIN")
        with cur.copy(statement.format(target.table(self.TABLE.name))) as copy:
            for row in rows:
                out = row.output
                copy.write_row(
                    (
                        target.app_id,
                        row.partition,
                        row.offset,
                        app.output_key_serde.serialize(out.key),
                        app.output_value_serde.serialize(out.value),
                        row.index,
                    )
                )

    def read_back(self, conn: psycopg.Connection, target: Target) -> list[StoredOutput]:
        app = target.app
        query = sql.SQL(
            "SELECT row_id, input_partition, input_offset, key, value, input_index FROM {} WHERE app_id = %s"
        )
        rows = conn.execute(query.format(target.table(self.TABLE.name)), (target.app_id,)).fetchall()
        return [
            StoredOutput(
                order,
                p,
                offset,
                Output(key=app.output_key_serde.deserialize(key), value=app.output_value_serde.deserialize(value)),
                index,
            )
            for order, p, offset, key, value, index in rows
        ]

    def check(self, conn: psycopg.Connection, target: Target, states: dict[int, dict[str, Any]]) -> list[str]:
        return []


@dataclass(frozen=True)
class PostgresApp(App):
    """An App with its PostgreSQL sink. Still an App: `pipeline run` loads it and the Kafka mode ignores the sink."""

    postgres_sink: TableSink = field(default_factory=BytesOutputs)
