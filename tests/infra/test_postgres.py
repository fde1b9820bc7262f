"""Proofs that the PostgreSQL under the tests is real and transactional (each fails against a fake)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.plugins.postgres import connect

pytestmark = pytest.mark.postgres


def create_table(dsn: str, schema: str) -> sql.Composed:
    table = sql.Identifier(schema, "events")
    with connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, payload text NOT NULL)").format(table))
    return table


def rows(conn: psycopg.Connection, table: sql.Composed) -> list[tuple[int, str]]:
    return conn.execute(sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(table)).fetchall()


def test_server_is_postgres_with_durable_commits(postgres_dsn):
    with connect(postgres_dsn) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        durability = "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')"
        settings = dict(conn.execute(durability).fetchall())
    assert version.startswith("PostgreSQL ")
    assert settings == {"fsync": "on", "synchronous_commit": "on"}


def test_committed_transaction_is_visible_from_another_connection_only_after_commit(postgres_dsn, pg_schema):
    table = create_table(postgres_dsn, pg_schema)
    with connect(postgres_dsn) as writer, connect(postgres_dsn, autocommit=True) as reader:
        writer.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(table))
        assert rows(writer, table) == [(1, "a"), (2, "b")]
        assert rows(reader, table) == [], "uncommitted rows leaked to another connection"
        writer.commit()
        assert rows(reader, table) == [(1, "a"), (2, "b")]
    with connect(postgres_dsn) as fresh:
        assert rows(fresh, table) == [(1, "a"), (2, "b")]


def test_rolled_back_transaction_leaves_nothing(postgres_dsn, pg_schema):
    table = create_table(postgres_dsn, pg_schema)
    with connect(postgres_dsn) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'kept')").format(table))
        conn.commit()
        conn.execute(sql.SQL("INSERT INTO {} VALUES (2, 'gone')").format(table))
        conn.execute(sql.SQL("UPDATE {} SET payload = 'changed' WHERE id = 1").format(table))
        conn.rollback()
    with connect(postgres_dsn) as other:
        assert rows(other, table) == [(1, "kept")]


def test_failed_statement_aborts_the_whole_transaction(postgres_dsn, pg_schema):
    table = create_table(postgres_dsn, pg_schema)
    with connect(postgres_dsn) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'first')").format(table))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'duplicate')").format(table))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute(sql.SQL("INSERT INTO {} VALUES (2, 'after error')").format(table))
        conn.rollback()
    with connect(postgres_dsn) as other:
        assert rows(other, table) == []
