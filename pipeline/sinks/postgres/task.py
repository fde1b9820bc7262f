"""task(p) of the PostgreSQL sink: one input partition's records processed in memory, its batch written by the
runner in one database transaction (pipeline/sinks/postgres/runner.py: `commit_batch`). What it shares with the Kafka
sink's task (position, batch, retries, the phases) is pipeline/core/task.py.

    fence()     bump p's owner epoch in pipeline_offsets, in its own committed transaction, and read p's next
                offset in the same statement. From then on every write transaction of an older owner (a zombie)
                fails its epoch check and rolls back (docs/guarantees.md: pg-epoch-fence). Kafka's group offsets
                are not read: the database is the truth.                                   NEW -> RESTORING
    restore_step() p's state rows, a few pages at a time between polls while p stays paused (docs/guarantees.md:
                restore-keeps-membership); once all are in and the epoch is still ours, the runner seeks to the
                offset read by the fence (try_seek_back).                RESTORING -> REWINDING -> RUNNING
    process()   decode -> process -> collect outputs, state changes and dead letters in memory (no database I/O);
                a record that fails is retried, then dead-lettered into the batch or stops p
                (pipeline/core/processing.py; docs/guarantees.md: no-silent-skip)             RUNNING -> STOPPED
    advance_offset(), write_state(), write_dead_letters()
                what the runner's commit writes of p, inside its transaction
    after any failure: nothing of the batch stays (one transaction). The runner throws this task away and takes
                p over again later with a new one: fence again, restore offset and state from the tables, seek.
                That is also how a commit whose outcome is unknown (connection lost during COMMIT) is resolved: the
                table says.

State: kept in PostgreSQL (pipeline_state, written in the batch's transaction) and loaded into memory after the fence,
in pages of RESTORE_PAGE_ROWS ordered by key (keyset: each page starts after the last key read). Each page is one
short statement of its own: no transaction, cursor or connection is held between polls, so a paused process holds
nothing that could block the next owner, and no single statement meets statement_timeout however large the state.
The pages agree with each other without one snapshot: after our fence only a transaction holding our epoch can
change p's rows (every write advances the offsets row WHERE epoch = its own first), and the epoch is read again
after the last page.
The offsets row is updated first in the transaction, so it is locked until the commit: a new owner's fence waits
for an in-flight batch to finish (then reads its result) or finds it rolled back, never half of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from pipeline.app import DEAD_LETTERS as HELD_LETTERS
from pipeline.app import App, Output, checked_outputs
from pipeline.core.deadletter import DeadLetter, held_dead_letter
from pipeline.core.processing import Attempts, record_from_message
from pipeline.core.schedule import Schedule
from pipeline.core.task import Task
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.schema import DEAD_LETTERS, OFFSETS, STATE
from pipeline.sinks.postgres.tables import OutputRow, TableSink, Target
from pipeline.state.table_restore import TableRestore

log = logging.getLogger(__name__)
# Rows per page of the stepped restore: one page is ~10-50 ms (1 M rows/s on a quiet machine), so a step of
# RESTORE_STEP_MS reads a few pages and returns to poll() in time.
RESTORE_PAGE_ROWS = 10_000


class Fenced(Exception):
    """p's epoch is no longer this task's: another owner fenced it. Nothing of the batch was kept."""


class WriteFailed(Exception):
    """A database step failed (server gone, connection lost, statement error). Nothing of the batch was kept, or
    the outcome of the COMMIT is unknown; either way p is taken over again from what the tables say."""


@dataclass(frozen=True)
class PostgresTaskContext:
    app: App
    settings: Settings
    app_id: str
    input_topic: str
    pool: psycopg_pool.ConnectionPool
    sink: TableSink
    metrics: Metrics
    owner: str  # written to the offsets row: who holds the epoch (host, pid, client id)
    pool_wait_s: float = 5.0
    schedule: Schedule | None = None  # the runner's loop's (None: each task has its own, outside a loop)
    global_tables: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)  # name -> what process reads
    # Partition p's co-partitioned tables, read from their topics (None: the App has none)
    table_restore: Callable[[int], TableRestore] | None = None

    @property
    def target(self) -> Target:
        return Target(self.settings.postgres_schema, self.app, self.app_id, self.input_topic)

    def table(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.settings.postgres_schema, name)


class PostgresTask(Task):
    def __init__(self, ctx: PostgresTaskContext, partition: int) -> None:
        s, metrics = ctx.settings, ctx.metrics
        attempts = Attempts.of(s, metrics.processing_errors.labels(str(partition)), metrics.dead_letters)
        super().__init__(ctx.app, s, metrics, ctx.input_topic, partition, attempts, ctx.schedule)
        self.ctx = ctx
        self.epoch: int | None = None
        self.restored_keys = 0
        self.restore_seconds = 0.0  # from the fence to the last page
        self._restore_started = 0.0
        self._restored_up_to: str | None = None  # the last state key read (keyset pagination); None: none yet
        self._pages_done = False  # every state row is in (the co-partitioned tables may still be read)
        self.rows: list[OutputRow] = []  # the batch's outputs, with the input record each came from
        self.dead_letters: list[DeadLetter] = []  # the batch's dead letters
        self.state.tables = self.table_views()
        offsets, state, dead = (ctx.table(t.name) for t in (OFFSETS, STATE, DEAD_LETTERS))
        self._sql_fence = sql.SQL(
            "INSERT INTO {t} AS o (app_id, topic, input_partition, next_offset, epoch, owner) "
            "VALUES (%s, %s, %s, NULL, 1, %s) ON CONFLICT (app_id, topic, input_partition) "
            "DO UPDATE SET epoch = o.epoch + 1, owner = EXCLUDED.owner, fenced_at = now() RETURNING epoch, next_offset"
        ).format(t=offsets)
        self._sql_read_offset = sql.SQL(
            "SELECT next_offset, epoch, owner FROM {t} WHERE app_id = %s AND topic = %s AND input_partition = %s"
        ).format(t=offsets)
        read_page = (
            "SELECT key, value FROM {t} WHERE app_id = %s AND topic = %s AND input_partition = %s {after} "
            "ORDER BY key LIMIT %s"
        )  # the primary key's index: each page is an index range scan
        self._sql_first_page = sql.SQL(read_page).format(t=state, after=sql.SQL(""))
        self._sql_next_page = sql.SQL(read_page).format(t=state, after=sql.SQL("AND key > %s"))
        self._sql_advance = sql.SQL(
            "UPDATE {t} SET next_offset = %s, committed_at = now() "
            "WHERE app_id = %s AND topic = %s AND input_partition = %s AND epoch = %s"
        ).format(t=offsets)
        self._sql_upsert_state = sql.SQL(
            "INSERT INTO {t} (app_id, topic, input_partition, key, value) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (app_id, topic, input_partition, key) DO UPDATE SET value = EXCLUDED.value"
        ).format(t=state)
        self._sql_delete_state = sql.SQL(
            "DELETE FROM {t} WHERE app_id = %s AND topic = %s AND input_partition = %s AND key = %s"
        ).format(t=state)
        self._sql_dead_letter = sql.SQL(
            "INSERT INTO {t} (app_id, topic, input_partition, input_offset, key, value, error_type, error_message, "
            "attempts, rejected) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        ).format(t=dead)

    @property
    def _where(self) -> tuple[str, str, int]:
        return (self.ctx.app_id, self.ctx.input_topic, self.partition)

    # -- 1. fence, then 2. restore: what a new owner does before it reads a record of p ----------------------------
    def fence(self) -> int | None:
        """Fences p and reads its next offset (None: from the beginning), which it returns; the state follows in
        restore_step(). Raises WriteFailed if the database is not usable (the worker stays NEW, never to be used
        again)."""
        self._restore_started = time.monotonic()
        try:
            with self.connection() as conn, conn.transaction():
                row = conn.execute(self._sql_fence, (*self._where, self.ctx.owner)).fetchone()
                assert row is not None  # INSERT ... ON CONFLICT DO UPDATE ... RETURNING: always one row
                self.epoch, self.committed_offset = row
                self._read_other_offsets(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            self.epoch = None  # fenced maybe, but not usable
            raise WriteFailed(f"{type(e).__name__}: {first_line(e)}") from e
        self.start(self.committed_offset, restore=True)
        return self.committed_offset

    def restore_step(self, budget_s: float) -> bool:
        """Reads p's state rows for about budget_s (at least one page); True once all are in and p's epoch is still
        ours: then p waits for the seek to the fenced offset (REWINDING). Raises Fenced if another owner fenced p
        meanwhile, WriteFailed if the database is not usable (the worker is not to be used again)."""
        until = time.monotonic() + budget_s
        try:
            if not self._pages_done:
                with self.connection() as conn:
                    while not self._read_page(conn):
                        if time.monotonic() >= until:
                            return False
                self._pages_done = True
            if not self._restore_tables(until):
                return False
            with self.connection() as conn:
                self._check_still_ours(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            self.epoch = None
            raise WriteFailed(f"{type(e).__name__}: {first_line(e)}") from e
        self.restored_keys = len(self.state)
        self.restored(self.state)  # complete; the position comes from the fenced offset: the seek is pending
        self.state.tables = self.table_views()
        self.restore_seconds = time.monotonic() - self._restore_started
        self.ctx.metrics.observe_restore(self.partition, self.restore_seconds, self.restored_keys)
        return True

    @property
    def restore_progress(self) -> tuple[str | None, int]:
        """Changes with every page of state rows read (the stall watchdog, pipeline/core/stall.py)."""
        return self._restored_up_to, len(self.state)

    def take_over(self) -> int | None:
        """fence() and every restore_step() in one go (tests and tools; the runner steps the restore between
        polls). Returns the offset to seek to."""
        offset = self.fence()
        while not self.restore_step(1.0):
            pass
        return offset

    def _read_other_offsets(self, conn: psycopg.Connection) -> None:
        """In the fence's transaction: the offsets of the App's other inputs and tables (none for one input)."""

    def _restore_tables(self, until: float) -> bool:
        """After the state rows: p's co-partitioned tables read from their topics until `until`; True once done
        (at once for an App without them)."""
        return True

    def table_views(self) -> dict[str, Mapping[Any, Any]]:
        """The tables `process` reads through `state.tables` (a one-input App's: the global ones)."""
        return dict(self.ctx.global_tables)

    def discard(self) -> None:
        """The task is thrown away (failed, revoked, lost): what it holds besides memory is released."""

    def _read_page(self, conn: psycopg.Connection) -> bool:
        """Loads the next page of p's state rows; True when it was the last one."""
        if self._restored_up_to is None:
            rows = conn.execute(self._sql_first_page, (*self._where, RESTORE_PAGE_ROWS)).fetchall()
        else:
            rows = conn.execute(self._sql_next_page, (*self._where, self._restored_up_to, RESTORE_PAGE_ROWS)).fetchall()
        self.state.load(dict(rows))  # bytea arrives as bytes: one C-level update
        if len(rows) < RESTORE_PAGE_ROWS:
            return True
        self._restored_up_to = rows[-1][0]
        return False

    def _check_still_ours(self, conn: psycopg.Connection) -> None:
        row = conn.execute(self._sql_read_offset, self._where).fetchone()
        if row is None:  # deleted under the restore (a schema reset, a manual repair): not ours to go on with
            raise Fenced(f"p{self.partition}: the offsets row is gone (ours was epoch {self.epoch})")
        _, epoch, owner = row
        if epoch != self.epoch:
            raise Fenced(
                f"p{self.partition}: fenced during the restore (epoch {epoch} of {owner}, ours was {self.epoch})"
            )

    # -- 3. process: in memory only ------------------------------------------------------------------------------------
    def process(self, messages: list[Consumed]) -> None:
        app, state = self.app, self.state
        processed = produced = 0
        for msg in messages:
            offset = msg.offset()
            if self.next_offset is not None and offset < self.next_offset:
                continue  # fetched before the seek to the restored offset took effect
            if not self.batch_open:
                self.open_batch()
            state.begin_record()
            try:
                outputs = checked_outputs("process", app.process(state, record_from_message(app, msg)))
            except Exception as error:  # decoding or user code: poison until proven otherwise
                outputs = self._retry(msg, error)
            produced += self.add_outputs(outputs, offset)
            self.next_offset = offset + 1
            self.batch_records += 1
            processed += 1
        if processed:
            self.note_batch(messages, msg, processed, produced)

    def add_outputs(self, outputs: Iterable[Output], offset: int, index: int = 0) -> int:
        """A record's outputs become rows of the batch; an output that dead-letters a record held earlier
        (app.dead_letter) becomes a dead-letter row naming that record. Returns how many."""
        count = 0
        for out in outputs:
            if out.topic is HELD_LETTERS:
                self.dead_letters.append(held_dead_letter(self.app, out))
                self.ctx.metrics.dead_letters.inc()
            else:
                self.rows.append(OutputRow(self.partition, offset, out, index))
            count += 1
        return count

    def _retry(self, msg: Consumed, error: Exception) -> list[Output]:
        """After a failed first attempt: the shared retry path (pipeline/core/processing.py). Its dead letter becomes
        a row of this batch's transaction, which commits it with the offset past the record; no outputs then."""
        app, state = self.app, self.state
        outcome = self.retry_record(
            msg, error, lambda: checked_outputs("process", app.process(state, record_from_message(app, msg)))
        )
        if isinstance(outcome, DeadLetter):
            self.dead_letters.append(outcome)
            return []
        return outcome

    # -- 4. what the runner's commit writes of p (pipeline/sinks/postgres/runner.py: commit_batch) --------------------
    def batch_committed(self) -> None:
        super().batch_committed()
        self.rows, self.dead_letters = [], []

    def advance_offset(self, cur: psycopg.Cursor) -> None:
        """The epoch check: p's offset moves only if p's epoch is still ours. Tests replace this with a broken
        version to show that the fence, not a constraint, keeps a zombie's duplicates out."""
        cur.execute(self._sql_advance, (self.next_offset, *self._where, self.epoch))
        if cur.rowcount != 1:
            current = cur.execute(self._sql_read_offset, self._where).fetchone()
            now = f"epoch {current[1]} of {current[2]}" if current else "no offsets row"
            log.warning(
                "p%d: epoch check failed: epoch %s is not ours any more (%s); rolling back %d records",
                self.partition,
                self.epoch,
                now,
                self.batch_records,
            )
            raise Fenced(f"p{self.partition}: epoch {self.epoch} fenced ({now})")

    def write_state(self, cur: psycopg.Cursor) -> None:
        upserts, deletes = [], []
        for key, value in self.state.changes():
            if value is None:
                deletes.append((*self._where, key))
            else:
                upserts.append((*self._where, key, value))
        if upserts:
            cur.executemany(self._sql_upsert_state, upserts)
        if deletes:
            cur.executemany(self._sql_delete_state, deletes)

    def write_dead_letters(self, cur: psycopg.Cursor) -> None:
        if self.dead_letters:
            cur.executemany(
                self._sql_dead_letter,
                [
                    (
                        self.ctx.app_id,
                        d.topic,  # the record's own input (several inputs: not always the first)
                        d.partition,
                        d.offset,
                        d.key,
                        d.value,
                        d.error_type,
                        d.error_message[:2000],
                        d.attempts,
                        d.rejected,
                    )
                    for d in self.dead_letters
                ],
            )

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self.ctx.pool.connection(timeout=self.ctx.pool_wait_s) as conn:
            yield conn


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
