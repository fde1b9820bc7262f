"""worker(p) of the PostgreSQL sink: the exactly-once protocol for one input partition, top to bottom.

    fence()     bump p's owner epoch in pipeline_offsets, in its own committed transaction, and read p's next
                offset in the same statement. From then on every write transaction of an older owner (a zombie)
                fails its epoch check and rolls back (docs/guarantees.md: pg-epoch-fence). Kafka's group offsets
                are not read: the database is the truth.                                   NEW -> RESTORING
    restore_step() p's state rows, a few pages at a time between polls while p stays paused (docs/guarantees.md:
                restore-keeps-membership); once all are in and the epoch is still ours, the runner seeks to the
                offset read by the fence.                                   RESTORING -> RUNNING -> REWINDING
    positioned() the consumer reads from that offset now                                  REWINDING -> RUNNING
    process()   decode -> process -> collect outputs, state changes and dead letters in memory (no database I/O);
                a record that fails is retried, then dead-lettered into the batch or stops p
                (pipeline/processing.py; docs/guarantees.md: no-silent-skip)                RUNNING -> STOPPED
    commit()    ONE transaction: advance p's offset row WHERE epoch = ours (0 rows: fenced -> roll back), write the
                outputs through the sink, upsert/delete the changed state keys, insert the dead letters; commit.
    after any failure: nothing of the batch stays (one transaction). The runner throws this worker away and takes
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import psycopg_pool
from confluent_kafka import Message
from psycopg import sql

from pipeline.app import App, Output
from pipeline.deadletter import DeadLetter
from pipeline.lifecycle import Lifecycle, Phase, commit_deadline
from pipeline.metrics import Metrics
from pipeline.postgres.schema import DEAD_LETTERS, OFFSETS, STATE
from pipeline.postgres.sink import OutputRow, TableSink, Target
from pipeline.processing import Attempts, record_from_message
from pipeline.settings import Settings
from pipeline.state import PartitionState

log = logging.getLogger(__name__)
# Rows per page of the stepped restore: one page is ~10-50 ms (1 M rows/s on a quiet machine), so a step of
# RESTORE_STEP_MS reads a few pages and returns to poll() in time.
RESTORE_PAGE_ROWS = 10_000


class Fenced(Exception):
    """p's epoch is no longer this worker's: another owner fenced it. Nothing of the batch was kept."""


class WriteFailed(Exception):
    """A database step failed (server gone, connection lost, statement error). Nothing of the batch was kept, or
    the outcome of the COMMIT is unknown; either way p is taken over again from what the tables say."""


@dataclass(frozen=True)
class WorkerContext:
    app: App
    settings: Settings
    app_id: str
    input_topic: str
    pool: psycopg_pool.ConnectionPool
    sink: TableSink
    metrics: Metrics
    owner: str  # written to the offsets row: who holds the epoch (host, pid, client id)
    pool_wait_s: float = 5.0

    @property
    def target(self) -> Target:
        return Target(self.settings.postgres_schema, self.app, self.app_id, self.input_topic)

    def table(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.settings.postgres_schema, name)


class PgWorker(Lifecycle):
    def __init__(self, ctx: WorkerContext, partition: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.partition = partition
        self.label = str(partition)
        self.state = PartitionState(ctx.app.state_serde)
        self.epoch: int | None = None
        self.committed_offset: int | None = None  # next input offset per the offsets row (None: nothing yet)
        self.next_offset: int | None = None  # next input offset to process
        self.restored_keys = 0
        self.restore_seconds = 0.0  # from the fence to the last page
        self._restore_started = 0.0
        self._restored_up_to: str | None = None  # the last state key read (keyset pagination); None: none yet
        self._rows: list[OutputRow] = []
        self._dead: list[DeadLetter] = []
        self._batch_records = 0
        self._batch_started = 0.0
        self._batch_first_timestamp = self._batch_last_timestamp = 0  # of its input records (ms): end-to-end latency
        self._records_in = ctx.metrics.records_in.labels(self.label)
        self._records_out = ctx.metrics.records_out.labels(self.label)
        self._attempts = Attempts.of(
            ctx.settings, ctx.metrics.processing_errors.labels(self.label), ctx.metrics.dead_letters
        )
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
            "attempts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
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
            with self._connection() as conn, conn.transaction():
                self.epoch, self.committed_offset = conn.execute(
                    self._sql_fence, (*self._where, self.ctx.owner)
                ).fetchone()
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            self.epoch = None  # fenced maybe, but not usable
            raise WriteFailed(f"{type(e).__name__}: {_first_line(e)}") from e
        self.next_offset = self.committed_offset
        self._transition(Phase.RESTORING)
        return self.committed_offset

    def restore_step(self, budget_s: float) -> bool:
        """Reads p's state rows for about budget_s (at least one page); True once all are in and p's epoch is still
        ours: then p waits for the seek to the fenced offset (REWINDING). Raises Fenced if another owner fenced p
        meanwhile, WriteFailed if the database is not usable (the worker is not to be used again)."""
        until = time.monotonic() + budget_s
        try:
            with self._connection() as conn:
                while not self._read_page(conn):
                    if time.monotonic() >= until:
                        return False
                self._check_still_ours(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            self.epoch = None
            raise WriteFailed(f"{type(e).__name__}: {_first_line(e)}") from e
        self.restored_keys = len(self.state)
        self._transition(Phase.RUNNING)  # the state is complete (as the Kafka sink's task after its restore) ...
        self._transition(Phase.REWINDING)  # ... and the position comes from the fenced offset: the seek is pending
        self.restore_seconds = time.monotonic() - self._restore_started
        self.ctx.metrics.restore_seconds.labels(self.label).set(self.restore_seconds)
        self.ctx.metrics.restore_records.labels(self.label).inc(self.restored_keys)
        return True

    def take_over(self) -> int | None:
        """fence() and every restore_step() in one go (tests and tools; the runner steps the restore between
        polls). Returns the offset to seek to."""
        offset = self.fence()
        while not self.restore_step(1.0):
            pass
        return offset

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
        _, epoch, owner = conn.execute(self._sql_read_offset, self._where).fetchone()
        if epoch != self.epoch:
            raise Fenced(
                f"p{self.partition}: fenced during the restore (epoch {epoch} of {owner}, ours was {self.epoch})"
            )

    def positioned(self) -> None:
        """The consumer reads p from the restored offset now (assigned there, or the seek took effect)."""
        self._transition(Phase.RUNNING)

    # -- 3. process: in memory only ------------------------------------------------------------------------------------
    def process(self, messages: list[Message]) -> None:
        app, state = self.ctx.app, self.state
        processed = 0
        for msg in messages:
            offset = msg.offset()
            if self.next_offset is not None and offset < self.next_offset:
                continue  # fetched before the seek to the restored offset took effect
            if not self._batch_records:
                self._batch_started = time.monotonic()
            state.begin_record()
            try:
                outputs = list(app.process(state, record_from_message(app, msg)))
            except Exception as error:  # decoding or user code: poison until proven otherwise
                outputs = self._retry(msg, error)
            self._rows.extend(OutputRow(self.partition, offset, out) for out in outputs)
            self._records_out.inc(len(outputs))
            self.next_offset = offset + 1
            self._batch_records += 1
            processed += 1
        if processed:
            self._batch_first_timestamp = self._batch_first_timestamp or messages[0].timestamp()[1]
            self._batch_last_timestamp = msg.timestamp()[1]
        self._records_in.inc(processed)

    def _retry(self, msg: Message, error: Exception) -> list[Output]:
        """After a failed first attempt: the shared retry path (pipeline/processing.py). Its dead letter becomes a
        row of this batch's transaction, which commits it with the offset past the record; no outputs then."""
        app, state = self.ctx.app, self.state
        outcome = self._attempts.retry(
            state, msg, error, lambda: list(app.process(state, record_from_message(app, msg)))
        )
        if isinstance(outcome, DeadLetter):
            self._dead.append(outcome)
            return []
        return outcome

    # -- 4. commit: one database transaction -----------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Records processed since the last commit."""
        return self._batch_records

    def commit_deadline(self) -> float | None:
        s = self.ctx.settings
        return (
            commit_deadline(self._batch_started, self._batch_records, s.commit_interval_ms, s.commit_max_records)
            if self._batch_records
            else None
        )

    def commit(self) -> None:
        """Writes the batch and advances p's offset in one transaction, or raises Fenced / WriteFailed with nothing
        of it kept (then this worker must not be used again: the runner takes p over anew)."""
        if not self._batch_records:
            return
        started = time.monotonic()
        try:
            with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
                self._advance_offset(cur)  # first: locks p's row until COMMIT, fails at once for a zombie
                if self._rows:
                    self.ctx.sink.write(cur, self.ctx.target, self._rows)
                self._write_state(cur)
                self._write_dead_letters(cur)
        except Fenced:
            self.ctx.metrics.transactions.labels(self.label, "fenced").inc()
            raise
        except Exception as e:  # server gone, COMMIT outcome unknown, or the sink's statement failed
            self.ctx.metrics.transactions.labels(self.label, "failed").inc()
            raise WriteFailed(f"{type(e).__name__}: {_first_line(e)}") from e
        self.state.commit()
        self.committed_offset = self.next_offset
        self._rows, self._dead, self._batch_records = [], [], 0
        self.ctx.metrics.commit_latency.observe(time.monotonic() - started)
        self.ctx.metrics.observe_end_to_end(self._batch_first_timestamp, self._batch_last_timestamp)
        self._batch_first_timestamp = self._batch_last_timestamp = 0
        self.ctx.metrics.transactions.labels(self.label, "committed").inc()

    def _advance_offset(self, cur: psycopg.Cursor) -> None:
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
                self._batch_records,
            )
            raise Fenced(f"p{self.partition}: epoch {self.epoch} fenced ({now})")

    def _write_state(self, cur: psycopg.Cursor) -> None:
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

    def _write_dead_letters(self, cur: psycopg.Cursor) -> None:
        if self._dead:
            cur.executemany(
                self._sql_dead_letter,
                [
                    (
                        *self._where[:2],
                        d.partition,
                        d.offset,
                        d.key,
                        d.value,
                        d.error_type,
                        d.error_message[:2000],
                        d.attempts,
                    )
                    for d in self._dead
                ],
            )

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        with self.ctx.pool.connection(timeout=self.ctx.pool_wait_s) as conn:
            yield conn


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
