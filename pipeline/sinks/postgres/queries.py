"""Interactive queries (pipeline/core/queries.py) of the PostgreSQL sink.

A partition this process runs is answered from its task's committed state in memory, as the Kafka sink's: no
database round trip, and the task's committed state moves only after its batch's COMMIT. Any other partition (owned
elsewhere, being taken over or restored here) is answered from the tables, which hold committed state only: its
`pipeline_state` rows with the `next_offset` of its `pipeline_offsets` row, read in one statement (one snapshot), so
the value and the offset it names belong to the same commit. That needs no directory of owners and no redirect: every
instance answers every key. The reads use a small pool of their own (QUERY_DB_CONNECTIONS), never the
commits' connections.
"""

from __future__ import annotations

from typing import Any

import psycopg_pool
from psycopg import sql

from pipeline.core.queries import RowsRead
from pipeline.settings import Settings
from pipeline.sinks.postgres.schema import OFFSETS, STATE, connection_kwargs

QUERY_DB_CONNECTIONS = 2  # HTTP threads reading the tables at once; more wait (up to the request time-out)


class CommittedRows:
    """Reads of p's committed state from the tables, for `Queries(rows=...)`: rows(p) -> a RowsRead."""

    def __init__(self, settings: Settings, app_id: str, input_topic: str) -> None:
        self._app_id, self._input_topic = app_id, input_topic
        self._timeout_s = settings.request_timeout_ms / 1000
        kwargs = connection_kwargs(settings, f"pipeline {app_id} queries")
        self._pool = psycopg_pool.ConnectionPool(
            settings.postgres_dsn,
            min_size=0,
            max_size=QUERY_DB_CONNECTIONS,
            kwargs={**kwargs, "autocommit": True},
            name=f"pipeline-{app_id}-queries",
            open=False,
        )
        self._opened = False
        offsets, state = (sql.Identifier(settings.postgres_schema, t.name) for t in (OFFSETS, STATE))
        partition = "o.app_id = %s AND o.topic = %s AND o.input_partition = %s"
        same = "s.app_id = o.app_id AND s.topic = o.topic AND s.input_partition = o.input_partition"
        self.sql_get = sql.SQL(
            f"SELECT o.next_offset, s.value FROM {{o}} o LEFT JOIN {{s}} s ON {same} AND s.key = %s WHERE {partition}"
        ).format(o=offsets, s=state)
        # Python's order of str keys (code points) is the "C" collation's; starts_with: no LIKE escapes to get right
        self.sql_range = sql.SQL(
            f"SELECT o.next_offset, s.key, s.value FROM {{o}} o LEFT JOIN LATERAL (SELECT s.key, s.value FROM {{s}} s "
            f'WHERE {same} AND starts_with(s.key, %s) ORDER BY s.key COLLATE "C" LIMIT %s) s ON true WHERE {partition}'
        ).format(o=offsets, s=state)
        self.sql_offset = sql.SQL(f"SELECT o.next_offset FROM {{o}} o WHERE {partition}").format(o=offsets)

    def __call__(self, p: int) -> TableRowsRead:
        return TableRowsRead(self, p)

    def fetch(self, query: sql.Composed, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        if not self._opened:  # at the first query: a process never asked holds no connection
            self._pool.open(wait=False)
            self._opened = True
        with self._pool.connection(timeout=self._timeout_s) as conn:
            return conn.execute(query, params).fetchall()

    def where(self, p: int) -> tuple[str, str, int]:
        return (self._app_id, self._input_topic, p)

    def close(self) -> None:
        self._pool.close(timeout=self._timeout_s)


class TableRowsRead(RowsRead):
    """Partition p's committed rows. No offsets row: nothing of p was ever committed (offset None, no keys)."""

    def __init__(self, rows: CommittedRows, p: int) -> None:
        super().__init__(rows.where(p)[1])
        self._rows, self._where = rows, rows.where(p)

    def committed_get(self, key: str) -> bytes | None:
        found = self._rows.fetch(self._rows.sql_get, (key, *self._where))
        self.committed_offset = found[0][0] if found else None
        return bytes(found[0][1]) if found and found[0][1] is not None else None

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        found = self._rows.fetch(self._rows.sql_range, (prefix, limit, *self._where))
        self.committed_offset = found[0][0] if found else None
        return [(key, bytes(value)) for _, key, value in found if key is not None]

    def offset_now(self) -> int | None:
        found = self._rows.fetch(self._rows.sql_offset, self._where)
        return found[0][0] if found else None
