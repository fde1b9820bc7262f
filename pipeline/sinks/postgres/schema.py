"""The tables of the PostgreSQL sink, created or migrated on start-up, and the start-up checks with clear errors.

Framework tables (in PIPELINE_POSTGRES_SCHEMA, shared by every app; rows are keyed by app id and input topic):
    pipeline_offsets        one row per input partition: next input offset (NULL: nothing committed yet), the
                            owner epoch (bumped by every new owner before it reads anything of p), who owns it
    pipeline_state          p's state, one row per key (the state serde's bytes), written with the batch
    pipeline_dead_letters   records that kept failing, written with the batch that moves past them
    pipeline_merge_order    an App with several inputs or tables: per transaction of p, where each topic of p
                            stood when it began and the order it took their records in (runs "index:count"), so
                            that the checker replays exactly that interleaving (docs/inputs.md). One row per
                            transaction per partition: only the checker reads it; delete old rows when no run is to
                            be verified from its start
    pipeline_schema_version the framework's schema version (migrations run once, under an advisory lock)

The sink's own tables (e.g. `totals` and `outputs` of the running-totals example) are created when missing and,
like the framework's, checked column by column: a table that exists with other columns or types stops the start
with a message naming every difference (never "fixed" silently: it may hold someone's data).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pipeline.retry import Backoff, retry
from pipeline.settings import ConfigError, Settings

log = logging.getLogger(__name__)

COMPONENT = "eos-pipeline"


class PostgresSetupError(ConfigError):
    """PostgreSQL cannot be used as configured: missing database, wrong credentials, a table that does not match.
    Retrying does not help; the message says what to fix."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as format_type() prints it: bigint, integer, text, bytea, jsonb, timestamp with time zone
    ddl: str = ""  # the rest of the column definition: NOT NULL, DEFAULT ..., GENERATED ALWAYS AS IDENTITY


@dataclass(frozen=True)
class AddColumn:
    """A migration step: a column added to a table that exists (IF EXISTS: the sink's default table may not)."""

    table: str
    column: Column

    def create_sql(self, schema: str) -> sql.Composed:
        c = self.column
        return sql.SQL("ALTER TABLE IF EXISTS {} ADD COLUMN IF NOT EXISTS {} {}").format(
            sql.Identifier(schema, self.table), sql.Identifier(c.name), sql.SQL(f"{c.type} {c.ddl}".strip())
        )


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()

    def ident(self, schema: str) -> sql.Identifier:
        return sql.Identifier(schema, self.name)

    def create_sql(self, schema: str) -> sql.Composed:
        parts = [
            sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(f"{c.type} {c.ddl}".strip())) for c in self.columns
        ]
        if self.primary_key:
            parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.primary_key))))
        return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(self.ident(schema), sql.SQL(", ").join(parts))


_PARTITION_KEY = (
    Column("app_id", "text", "NOT NULL"),
    Column("topic", "text", "NOT NULL"),
    Column("input_partition", "integer", "NOT NULL"),
)
OFFSETS = Table(
    "pipeline_offsets",
    (
        *_PARTITION_KEY,
        Column("next_offset", "bigint"),  # NULL: nothing committed yet (start from the beginning)
        Column("epoch", "bigint", "NOT NULL"),
        Column("owner", "text", "NOT NULL"),
        Column("fenced_at", "timestamp with time zone", "NOT NULL DEFAULT now()"),
        Column("committed_at", "timestamp with time zone"),
    ),
    ("app_id", "topic", "input_partition"),
)
STATE = Table(
    "pipeline_state",
    (*_PARTITION_KEY, Column("key", "text", "NOT NULL"), Column("value", "bytea", "NOT NULL")),
    ("app_id", "topic", "input_partition", "key"),
)
# `process` raised Reject: dead-lettered on purpose, and the checker folds the record all the same (version 2)
REJECTED = Column("rejected", "boolean", "NOT NULL DEFAULT false")
# The default sink's table (pipeline/sinks/postgres/tables.py, BytesOutputs): which input an output came from (version
# 2; 0: the first, and the only one of a one-input App)
INPUT_INDEX = Column("input_index", "integer", "NOT NULL DEFAULT 0")
DEAD_LETTERS = Table(
    "pipeline_dead_letters",
    (
        Column("id", "bigint", "GENERATED ALWAYS AS IDENTITY"),
        *_PARTITION_KEY,
        Column("input_offset", "bigint", "NOT NULL"),
        Column("key", "bytea"),
        Column("value", "bytea"),
        Column("error_type", "text", "NOT NULL"),
        Column("error_message", "text", "NOT NULL"),
        Column("attempts", "integer", "NOT NULL"),
        Column("created_at", "timestamp with time zone", "NOT NULL DEFAULT now()"),
        REJECTED,
    ),
    ("id",),
)
MERGE_ORDER = Table(
    "pipeline_merge_order",
    (
        Column("id", "bigint", "GENERATED ALWAYS AS IDENTITY"),  # p's transactions are serialised: commit order
        *_PARTITION_KEY,
        Column("epoch", "bigint", "NOT NULL"),
        Column("start_offsets", "jsonb", "NOT NULL"),  # topic -> next offset of p when the transaction began
        Column("runs", "text", "NOT NULL"),  # "index:count,...", index into the App's co-partitioned topics
        Column("committed_at", "timestamp with time zone", "NOT NULL DEFAULT now()"),
    ),
    ("id",),
)
SCHEMA_VERSION = Table(
    "pipeline_schema_version",
    (Column("component", "text", "NOT NULL"), Column("version", "integer", "NOT NULL")),
    ("component",),
)
FRAMEWORK_TABLES = (OFFSETS, STATE, DEAD_LETTERS, MERGE_ORDER)

# Migration n brings the framework's tables from version n-1 to n. Each runs once per schema, in the start-up
# transaction, under an advisory lock (instances starting together migrate once). Append, never edit. A table is
# created with its latest columns, so a later step that adds one of them to an older table must not fail when the
# column is there already (IF NOT EXISTS).
MIGRATIONS: tuple[tuple[Table | AddColumn, ...], ...] = (
    (OFFSETS, STATE, DEAD_LETTERS),  # 1: the initial tables
    # 2: several inputs and tables (docs/inputs.md): the merge order, which input an output came from, whether a
    #    dead letter was a Reject. The other topics' offsets are rows of pipeline_offsets (its topic column).
    (MERGE_ORDER, AddColumn(DEAD_LETTERS.name, REJECTED), AddColumn("pipeline_outputs", INPUT_INDEX)),
)
LATEST_VERSION = len(MIGRATIONS)


# -- connecting --------------------------------------------------------------------------------------------------
def describe_dsn(dsn: str) -> str:
    """user@host:port/dbname, without the password (for messages and logs)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise PostgresSetupError(f"POSTGRES_DSN is not a valid connection string: {e}") from None
    return f"{info.get('user', '?')}@{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '?')}"


def connection_kwargs(settings: Settings, application_name: str) -> dict[str, Any]:
    """Session settings of every connection of the sink.

    idle_in_transaction_session_timeout: a worker holds a transaction open only while it writes a batch, never while
    it waits. A process paused mid-transaction (SIGSTOP, a long GC) would hold p's offsets row locked and block the
    next owner's fence; the server ends such a session after this long, which also rolls its transaction back.
    lock_timeout and statement_timeout bound every wait (request_timeout_ms)."""
    timeout_ms = settings.request_timeout_ms
    options = (
        f"-c idle_in_transaction_session_timeout={settings.postgres_idle_in_transaction_timeout_ms} "
        f"-c lock_timeout={timeout_ms} -c statement_timeout={timeout_ms}"
    )
    return {
        "connect_timeout": max(2, timeout_ms // 1000),
        "application_name": application_name[:63],
        "options": options,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


def permanent_connect_error(dsn: str, error: psycopg.OperationalError) -> PostgresSetupError | None:
    """A clear error for what retrying cannot fix (missing database, credentials); None for "try again"."""
    text = str(error)
    where = describe_dsn(dsn)
    if "does not exist" in text and "database" in text:
        dbname = conninfo_to_dict(dsn).get("dbname", "?")
        return PostgresSetupError(
            f"POSTGRES_DSN {where}: database {dbname!r} does not exist. Create it "
            f"(CREATE DATABASE {dbname}) or point POSTGRES_DSN at another one."
        )
    if any(
        s in text
        for s in (
            "password authentication failed",
            "authentication failed",
            "no pg_hba.conf entry",
            'role "',
            "password is required",
            "permission denied",
        )
    ):
        return PostgresSetupError(
            f"POSTGRES_DSN {where}: PostgreSQL refused the credentials: "
            f"{_server_message(text)}. Check the user and password in POSTGRES_DSN."
        )
    return None


def _server_message(text: str) -> str:
    return text.split("FATAL:", 1)[-1].strip().splitlines()[0] if "FATAL:" in text else text.strip().splitlines()[0]


CONNECT_BACKOFF = Backoff(0.2, 2.0, 2.0)  # a server starting or restarting: soon, then every 2 s


def connect_checked(dsn: str, kwargs: dict[str, Any], timeout_s: float) -> psycopg.Connection:
    """A connection, retried with back-off while the server is unreachable or starting (up to timeout_s); a clear
    PostgresSetupError at once for a missing database or wrong credentials, or when the time is up."""

    def unreachable(error: Exception) -> bool:
        return isinstance(error, psycopg.OperationalError) and permanent_connect_error(dsn, error) is None

    try:
        return retry(
            lambda: psycopg.connect(dsn, **kwargs), retriable=unreachable, backoff=CONNECT_BACKOFF, within_s=timeout_s
        )
    except psycopg.OperationalError as e:
        if (permanent := permanent_connect_error(dsn, e)) is not None:
            raise permanent from None
        raise PostgresSetupError(
            f"POSTGRES_DSN {describe_dsn(dsn)}: PostgreSQL not reachable within "
            f"{timeout_s:.0f}s: {_server_message(str(e))}"
        ) from None


# The server ended the session: gone, restarted, failed over (OperationalError), or it ended a session left idle in
# its transaction past idle_in_transaction_session_timeout, which psycopg raises as an InternalError (SQLSTATE 25P03).
# A chaos run met the second: an instance SIGSTOPped while it prepared its schema exited 1 when it woke.
SESSION_ENDED = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


def session_ended(error: Exception) -> bool:
    return isinstance(error, SESSION_ENDED)


def prepare_database(dsn: str, kwargs: dict[str, Any], schema: str, tables: Sequence[Table], timeout_s: float) -> int:
    """connect_checked + ensure_schema, started again when the server goes away half-way (a restart, a failover):
    the migration is one transaction, so a retry sees either all of it or none. Returns the schema version."""
    deadline = time.monotonic() + timeout_s

    def prepare() -> int:
        with connect_checked(dsn, {**kwargs, "autocommit": True}, max(deadline - time.monotonic(), 1.0)) as conn:
            return ensure_schema(conn, schema, tables)

    def lost(error: Exception, failures: int, delay: float | None) -> None:
        if delay is not None:
            log.warning(
                "connection lost while preparing schema %r (%s); connecting again", schema, _server_message(str(error))
            )

    try:
        return retry(prepare, retriable=session_ended, backoff=Backoff(0.2, 1.0), within_s=timeout_s, on_failure=lost)
    except SESSION_ENDED as e:
        raise PostgresSetupError(
            f"POSTGRES_DSN {describe_dsn(dsn)}: connection lost while preparing "
            f"schema {schema!r}: {_server_message(str(e))}"
        ) from None


# -- schema --------------------------------------------------------------------------------------------------------
def ensure_schema(conn: psycopg.Connection, schema: str, tables: Sequence[Table] = ()) -> int:
    """Creates or migrates the framework's tables and creates the sink's `tables`, then checks every one of them.
    Idempotent; safe when several instances start at once. Returns the framework's schema version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{COMPONENT}:{schema}",))
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(SCHEMA_VERSION.create_sql(schema))
        _check_tables(conn, schema, [SCHEMA_VERSION])
        row = conn.execute(
            sql.SQL("SELECT version FROM {} WHERE component = %s").format(SCHEMA_VERSION.ident(schema)), (COMPONENT,)
        ).fetchone()
        version = row[0] if row else 0
        if version > LATEST_VERSION:
            raise PostgresSetupError(
                f"schema {schema!r} is at version {version} of the pipeline's tables, this code knows up to "
                f"{LATEST_VERSION}: it was migrated by a newer release; run that release (or another schema)"
            )
        for number in range(version + 1, LATEST_VERSION + 1):
            for table in MIGRATIONS[number - 1]:
                conn.execute(table.create_sql(schema))
        if version < LATEST_VERSION:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (component, version) VALUES (%s, %s) ON CONFLICT (component) "
                    "DO UPDATE SET version = EXCLUDED.version"
                ).format(SCHEMA_VERSION.ident(schema)),
                (COMPONENT, LATEST_VERSION),
            )
        for table in tables:
            conn.execute(table.create_sql(schema))
        _check_tables(conn, schema, [*FRAMEWORK_TABLES, *tables])
    return LATEST_VERSION


def _check_tables(conn: psycopg.Connection, schema: str, tables: Iterable[Table]) -> None:
    problems = []
    for table in tables:
        problems += table_problems(conn, schema, table)
    if problems:
        raise PostgresSetupError(
            "tables do not match what the pipeline writes: "
            + "; ".join(problems)
            + ". Migrate them by hand or drop them (missing tables are created on start-up)."
        )


def table_problems(conn: psycopg.Connection, schema: str, table: Table) -> list[str]:
    """Differences between `table` and what the database has (missing table or column, other type, other key)."""
    name = f"{schema}.{table.name}"
    query = "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))::oid"
    row = conn.execute(query, (schema, table.name)).fetchone()
    oid = None if row is None else row[0]  # always one row: to_regclass gives NULL for a missing table
    if oid is None:
        return [f"{name} does not exist"]
    have: dict[str, str] = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            (oid,),
        ).fetchall()
    )
    problems = []
    for column in table.columns:
        if column.name not in have:
            problems.append(f"{name}.{column.name} is missing (expected {column.type})")
        elif have[column.name] != column.type:
            problems.append(f"{name}.{column.name} is {have[column.name]}, expected {column.type}")
    if table.primary_key:
        pk = [
            r[0]
            for r in conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
                (oid,),
            ).fetchall()
        ]
        if sorted(pk) != sorted(table.primary_key):
            problems.append(
                f"{name} has primary key ({', '.join(pk) or 'none'}), expected ({', '.join(table.primary_key)})"
            )
    return problems
