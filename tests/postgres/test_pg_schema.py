"""Start-up of the PostgreSQL sink: tables created or migrated idempotently, and clear errors for a missing
database, wrong credentials, an unreachable server, a table that does not match, bad settings."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pipeline import settings as settings_module
from pipeline.examples.running_totals_pg import TotalsSink
from pipeline.settings import ConfigError, Settings
from pipeline.sinks.postgres.schema import (
    COMPONENT,
    DEAD_LETTERS,
    INPUT_INDEX,
    LATEST_VERSION,
    MERGE_ORDER,
    OFFSETS,
    REJECTED,
    SCHEMA_VERSION,
    STATE,
    PostgresSetupError,
    Table,
    connect_checked,
    ensure_schema,
    prepare_database,
)
from pipeline.sinks.postgres.tables import BytesOutputs
from tests.plugins.postgres import connect
from tests.support import eventually

pytestmark = pytest.mark.postgres
TABLES = TotalsSink.tables


def with_dsn(dsn: str, **changes: object) -> str:
    return make_conninfo(**{**conninfo_to_dict(dsn), **changes})


def test_schema_is_created_once_and_start_up_is_idempotent(postgres_dsn, pg_schema):
    with connect(postgres_dsn, autocommit=True) as conn:
        assert ensure_schema(conn, pg_schema, TABLES) == LATEST_VERSION
        assert ensure_schema(conn, pg_schema, TABLES) == LATEST_VERSION
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (pg_schema,))}
        # The fence, not a constraint, keeps duplicates out: the only index on outputs is its surrogate key.
        indexes = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = 'outputs'", (pg_schema,)
        ).fetchall()
    assert tables == {
        "pipeline_schema_version",
        "pipeline_offsets",
        "pipeline_state",
        "pipeline_dead_letters",
        "pipeline_merge_order",
        "outputs",
        "totals",
    }
    assert len(indexes) == 1 and "(row_id)" in indexes[0][0]


def test_instances_starting_together_migrate_once(postgres_dsn):
    schema = f"test_{uuid.uuid4().hex[:12]}"  # does not exist yet: created by the first one in
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with connect(postgres_dsn, autocommit=True) as conn:
                ensure_schema(conn, schema, TABLES)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        with connect(postgres_dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT component, version FROM {}").format(SCHEMA_VERSION.ident(schema))
            ).fetchall()
        assert rows == [(COMPONENT, LATEST_VERSION)]
    finally:
        with connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_connection_lost_during_the_migration_is_retried_on_a_new_one(postgres_dsn, pg_schema):
    # Hold the migration lock so the start-up waits inside its transaction, kill that backend (what a server
    # restart does to it), then let go: it must connect again and migrate, not end the process.
    name = f"migrate-{uuid.uuid4().hex[:8]}"
    lock = f"{COMPONENT}:{pg_schema}"
    result: list[object] = []
    with connect(postgres_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (lock,))
        starting = threading.Thread(target=lambda: result.append(_prepare_or_error(postgres_dsn, name, pg_schema)))
        starting.start()
        first = eventually(lambda: _pid_waiting_for_a_lock(holder, name))
        holder.execute("SELECT pg_terminate_backend(%s)", (first,))
        eventually(lambda: _pid_waiting_for_a_lock(holder, name) not in (None, first))
        holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock,))
        starting.join(30)
    assert result == [LATEST_VERSION]


def test_a_start_up_paused_mid_migration_past_the_idle_timeout_connects_again(postgres_dsn, pg_schema, monkeypatch):
    # A chaos run SIGSTOPped an instance while it prepared its schema: the server ended the session that sat idle in
    # its transaction (IdleInTransactionSessionTimeout, an InternalError, not an OperationalError) and the process
    # exited 1. The same pause here: the first check of the tables sleeps past the session's idle timeout.
    from pipeline.sinks.postgres import schema as schema_module

    check_tables, paused = schema_module._check_tables, []

    def pause_once(conn, schema, tables):
        if not paused:
            paused.append(True)
            time.sleep(1.0)
        check_tables(conn, schema, tables)

    monkeypatch.setattr(schema_module, "_check_tables", pause_once)
    kwargs = {"options": "-c idle_in_transaction_session_timeout=300"}
    assert prepare_database(postgres_dsn, kwargs, pg_schema, TABLES, 20) == LATEST_VERSION
    assert paused


def _prepare_or_error(dsn: str, application_name: str, schema: str) -> object:
    try:
        return prepare_database(dsn, {"application_name": application_name}, schema, TABLES, 20)
    except Exception as e:  # the assertion shows what was raised
        return e


def _pid_waiting_for_a_lock(conn, application_name: str) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'", (application_name,)
    ).fetchone()
    return row[0] if row else None


def version_1(schema: str, conn) -> None:
    """The tables as release 1 created them: no merge order, no dead letters' rejected, no outputs' input_index."""
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for table in (SCHEMA_VERSION, OFFSETS, STATE, DEAD_LETTERS, BytesOutputs.TABLE):
        old = Table(table.name, tuple(c for c in table.columns if c not in (REJECTED, INPUT_INDEX)), table.primary_key)
        conn.execute(old.create_sql(schema))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 1)").format(SCHEMA_VERSION.ident(schema)), (COMPONENT,))
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (app_id, topic, input_partition, next_offset, epoch, owner) VALUES ('a', 't', 0, 7, 3, 'o')"
        ).format(OFFSETS.ident(schema))
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (app_id, topic, input_partition, input_offset, error_type, error_message, attempts) "
            "VALUES ('a', 't', 0, 5, 'poison', 'm', 3)"
        ).format(DEAD_LETTERS.ident(schema))
    )
    conn.execute(
        sql.SQL("INSERT INTO {} (app_id, input_partition, input_offset, value) VALUES ('a', 0, 6, 'v')").format(
            BytesOutputs.TABLE.ident(schema)
        )
    )


def test_a_start_on_a_version_1_schema_migrates_it_and_keeps_its_rows(postgres_dsn):
    """Red with migration 2 left out: the start stops on the missing columns and table."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    try:
        with connect(postgres_dsn, autocommit=True) as conn:
            version_1(schema, conn)
        assert prepare_database(postgres_dsn, {}, schema, BytesOutputs.tables, 20) == LATEST_VERSION == 2
        with connect(postgres_dsn, autocommit=True) as conn:
            version = conn.execute(sql.SQL("SELECT version FROM {}").format(SCHEMA_VERSION.ident(schema))).fetchone()
            offsets = conn.execute(
                sql.SQL("SELECT next_offset, epoch FROM {}").format(OFFSETS.ident(schema))
            ).fetchall()
            letters = conn.execute(
                sql.SQL("SELECT input_offset, rejected FROM {}").format(DEAD_LETTERS.ident(schema))
            ).fetchall()
            outputs = conn.execute(
                sql.SQL("SELECT input_offset, input_index FROM {}").format(BytesOutputs.TABLE.ident(schema))
            ).fetchall()
            order = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(MERGE_ORDER.ident(schema))).fetchone()
        assert version == (2,) and offsets == [(7, 3)] and letters == [(5, False)] and outputs == [(6, 0)]
        assert order == (0,)
    finally:
        with connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_table_that_does_not_match_stops_the_start_with_every_difference(postgres_dsn, pg_schema):
    with connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (input_partition integer, input_offset integer, account text)").format(
                sql.Identifier(pg_schema, "outputs")
            )
        )
        with pytest.raises(PostgresSetupError) as raised:
            ensure_schema(conn, pg_schema, TABLES)
    message = str(raised.value)
    assert f"{pg_schema}.outputs.input_offset is integer, expected bigint" in message
    assert f"{pg_schema}.outputs.sum is missing" in message
    assert f"{pg_schema}.outputs has primary key (none), expected (row_id)" in message


def test_tables_of_a_newer_release_are_refused(postgres_dsn, pg_schema):
    with connect(postgres_dsn, autocommit=True) as conn:
        ensure_schema(conn, pg_schema, TABLES)
        conn.execute(sql.SQL("UPDATE {} SET version = version + 1").format(SCHEMA_VERSION.ident(pg_schema)))
        with pytest.raises(PostgresSetupError, match="migrated by a newer release"):
            ensure_schema(conn, pg_schema, TABLES)


def test_missing_database_wrong_credentials_and_unreachable_server_are_clear_errors(postgres_dsn):
    with pytest.raises(PostgresSetupError, match="database 'no_such_db' does not exist"):
        connect_checked(with_dsn(postgres_dsn, dbname="no_such_db"), {}, 5)
    with pytest.raises(PostgresSetupError, match=r"refused the credentials.*password authentication failed"):
        connect_checked(with_dsn(postgres_dsn, password="not-the-password"), {}, 5)
    with pytest.raises(PostgresSetupError, match="not reachable within 1s"):
        connect_checked(with_dsn(postgres_dsn, host="127.0.0.1", port=1), {"connect_timeout": 1}, 1)


def test_run_exits_2_naming_the_problem_without_leaking_the_password(postgres_dsn, kafka_bootstrap, new_topic):
    topic = new_topic("in", partitions=1)
    env = {
        **os.environ,
        "PIPELINE_SINK": "postgres",
        "PIPELINE_INPUT_TOPIC": topic,
        "PIPELINE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "PIPELINE_POSTGRES_DSN": with_dsn(postgres_dsn, password="s3cret-typo"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "pipeline.examples.running_totals_pg:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "configuration error: POSTGRES_DSN pipeline@127.0.0.1" in done.stderr
    assert "refused the credentials" in done.stderr
    assert "s3cret-typo" not in done.stderr + done.stdout


def test_settings_of_the_postgres_sink_are_validated():
    with pytest.raises(ConfigError, match="POSTGRES_DSN is empty"):
        Settings(sink="postgres")
    with pytest.raises(ConfigError, match="SINK must be kafka or postgres"):
        Settings(sink="mysql")
    with pytest.raises(ConfigError, match="exactly-once by construction"):
        Settings(sink="postgres", postgres_dsn="x", processing_guarantee="at_least_once")
    with pytest.raises(ConfigError, match="IDLE_IN_TRANSACTION_TIMEOUT_MS=20000 must be below"):
        Settings(sink="postgres", postgres_dsn="x", postgres_idle_in_transaction_timeout_ms=20_000)
    loaded = settings_module.load(
        env={"PIPELINE_SINK": "postgres", "PIPELINE_POSTGRES_DSN": "host=db", "PIPELINE_POSTGRES_POOL_SIZE": "8"}
    )
    assert (loaded.sink, loaded.postgres_dsn, loaded.postgres_pool_size) == ("postgres", "host=db", 8)
    assert "hunter2" not in repr(Settings(sink="postgres", postgres_dsn="postgresql://u:hunter2@db/x"))
