"""Test double: the running-totals PostgreSQL app with the epoch check removed from every write transaction.

The fence is still bumped on assignment, but a task's batch advances p's offsets row whatever the epoch, so a
zombie's late batch commits. Used to show that the zombie test can see duplicates: the fence, not a constraint on
the `outputs` table, is what keeps them out. Never use this outside tests.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pipeline.examples.running_totals_pg import app  # noqa: F401  (the App this module is loaded for)
from pipeline.sinks.postgres.task import PostgresTask


def _advance_offset_without_epoch_check(self: PostgresTask, cur: psycopg.Cursor) -> None:
    statement = sql.SQL(
        "UPDATE {} SET next_offset = %s, committed_at = now() WHERE app_id = %s AND topic = %s AND input_partition = %s"
    )
    cur.execute(
        statement.format(self.ctx.table("pipeline_offsets")),
        (self.next_offset, self.ctx.app_id, self.ctx.input_topic, self.partition),
    )


PostgresTask.advance_offset = _advance_offset_without_epoch_check
