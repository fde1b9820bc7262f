"""task(p) of the PostgreSQL sink for an App with several co-partitioned inputs or tables (docs/inputs.md): partition p
of every input stream and every co-partitioned table, one state, one database transaction, taken in timestamp order
by the same rule as the Kafka sink (pipeline/core/merge.py).

    fence()     p's epoch bumped on the first input's offsets row, as for one input; in the same transaction the
                offsets rows of the other topics of p are read (pipeline_offsets, one row per topic)
    restore     the state rows, then p's co-partitioned tables from their topics to their ends
                (pipeline/state/table_restore.py: the table may be ahead of the inputs, never behind); then every
                topic of p is sought to its offset
    taking      per-topic queues; the smallest timestamp first, ties tables first; an empty queue of a topic with
                records not fetched yet is waited for at most MAX_TASK_IDLE_MS (pipeline/core/merge.py)
    a table     a record of a co-partitioned table updates the table (`state.tables[name]`), not `process`
    commit      in the batch's transaction (runner.commit_batch): the first input's row moves under the epoch
                check, then every other topic's row, then one pipeline_merge_order row: where each topic stood when
                the transaction began and the order it took their records in, which the checker replays
                (pipeline/testing/postgres_checker.py)
    failure     as for one input: the task is thrown away and p taken over again from the tables (no rewind)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.types.json import Jsonb

from pipeline.app import App, checked_outputs
from pipeline.core.lifecycle import Phase
from pipeline.core.merge import OrderRuns, WaitsFromRunning, enqueue, merge_order, must_wait, next_run
from pipeline.core.processing import record_from_message
from pipeline.kafka.clients import restore_consumer_config
from pipeline.kafka.offsets import seek_all
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.schema import MERGE_ORDER, OFFSETS
from pipeline.sinks.postgres.task import PostgresTask, PostgresTaskContext, WriteFailed, first_line
from pipeline.state.global_tables import GlobalTables
from pipeline.state.table_restore import TableRestore
from pipeline.state.tables import TableStore


class PostgresMultiTask(WaitsFromRunning, PostgresTask):
    def __init__(self, ctx: PostgresTaskContext, partition: int) -> None:
        app = ctx.app
        self.topics: tuple[str, ...] = ctx.target.topics  # the streams, then the co-partitioned tables
        self.tables: dict[str, TableStore] = {spec.topic: TableStore(spec) for spec in app.table_specs.values()}
        self._table_names = {spec.topic: name for name, spec in app.table_specs.items()}
        super().__init__(ctx, partition)
        self._index = {topic: i for i, topic in enumerate(self.topics)}
        self.committed_offsets: dict[str, int | None] = dict.fromkeys(self.topics)
        self.next_offsets: dict[str, int | None] = dict.fromkeys(self.topics)
        self._queues: dict[str, deque[Consumed]] = {topic: deque() for topic in self.topics}
        self._empty_since = dict.fromkeys(self.topics, time.monotonic())
        self._merge_order = merge_order(self.topics, self.tables)
        self._rank = {topic: i for i, topic in enumerate(self._merge_order)}
        self._runs = OrderRuns()
        self._started_at: dict[str, int | None] = {}  # every topic's offset when the open batch began
        self._idle_s = ctx.settings.max_task_idle_ms / 1000
        self._table_restore: TableRestore | None = None
        self.consumer: Consumer | None = None  # the runner's: the cached watermarks the bounded wait looks at
        offsets, order = ctx.table(OFFSETS.name), ctx.table(MERGE_ORDER.name)
        self._sql_other_offsets = sql.SQL(
            "SELECT topic, next_offset FROM {t} WHERE app_id = %s AND input_partition = %s AND topic = ANY(%s)"
        ).format(t=offsets)
        self._sql_upsert_offset = sql.SQL(
            "INSERT INTO {t} AS o (app_id, topic, input_partition, next_offset, epoch, owner, committed_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (app_id, topic, input_partition) DO UPDATE SET "
            "next_offset = EXCLUDED.next_offset, epoch = EXCLUDED.epoch, owner = EXCLUDED.owner, committed_at = now()"
        ).format(t=offsets)
        self._sql_merge_order = sql.SQL(
            "INSERT INTO {t} (app_id, topic, input_partition, epoch, start_offsets, runs) "
            "VALUES (%s, %s, %s, %s, %s, %s)"
        ).format(t=order)

    def table_views(self) -> dict[str, Mapping[Any, Any]]:
        return {**super().table_views(), **{self._table_names[t]: s.view for t, s in self.tables.items()}}

    # -- fence and restore -----------------------------------------------------------------------------------------
    def _read_other_offsets(self, conn: psycopg.Connection) -> None:
        rows = conn.execute(self._sql_other_offsets, (self.ctx.app_id, self.partition, list(self.topics[1:])))
        committed: dict[str, int | None] = dict.fromkeys(self.topics)
        committed.update(dict(rows.fetchall()))
        committed[self.topics[0]] = self.committed_offset
        self.committed_offsets, self.next_offsets = dict(committed), dict(committed)

    def _restore_tables(self, until: float) -> bool:
        make = self.ctx.table_restore
        if make is None or not self.tables:
            return True
        try:
            if self._table_restore is None:
                self._table_restore = make(self.partition)
            restore = self._table_restore
            if not restore.step(max(0.001, until - time.monotonic())):
                return False
        except Exception as e:  # the broker, not the database: p is taken over again after a back-off all the same
            self.discard()
            raise WriteFailed(f"restoring the co-partitioned tables: {type(e).__name__}: {first_line(e)}") from e
        for name, store in restore.stores.items():
            self.tables[self.ctx.app.table_specs[name].topic] = store
        for topic, position in restore.positions.items():  # read on from where the restore ended
            self.committed_offsets[topic] = self.next_offsets[topic] = position
        self.discard()
        return True

    @property
    def restore_progress(self) -> tuple[str | None, int]:
        records = self._table_restore.records if self._table_restore is not None else 0
        return self._restored_up_to, len(self.state) + records

    def discard(self) -> None:
        if self._table_restore is not None:
            self._table_restore.close()
            self._table_restore = None

    def try_seek_back(self, consumer: Consumer) -> bool:
        """Every topic of p to its fenced (or restored) offset; p RUNNING once all seeks took."""
        if not seek_all(consumer, self.partition, {topic: self.committed_offsets[topic] for topic in self.topics}):
            return False
        for queue in self._queues.values():
            queue.clear()
        self.consumer = consumer
        self.seeks += 1
        self._transition(Phase.RUNNING)
        return True

    # -- processing --------------------------------------------------------------------------------------------------
    def process(self, messages: list[Consumed]) -> None:
        """Queues p's records by topic, then takes what can be taken in timestamp order."""
        if self._phase is not Phase.RUNNING:
            return
        enqueue(self._queues, self.next_offsets, messages)
        self.tick()

    def tick(self) -> None:
        """Every loop turn: an empty input may have been waited for long enough."""
        while self._phase is Phase.RUNNING:
            merged = next_run(
                self._queues, self._merge_order, self._rank, self._empty_since, self._must_wait, time.monotonic()
            )
            if not merged:
                return
            self._process_merged(merged)

    def _must_wait(self, topic: str, now: float) -> bool:
        def end_of() -> int:
            if self.consumer is None:
                return -1
            return int(self.consumer.get_watermark_offsets(TopicPartition(topic, self.partition), cached=True)[1])

        return must_wait(self._idle_s, self._empty_since[topic], now, end_of, self.next_offsets[topic])

    def _process_merged(self, merged: list[Consumed]) -> None:
        app, state, index, tables, nexts = self.app, self.state, self._index, self.tables, self.next_offsets
        processed = produced = 0
        for msg in merged:
            topic, offset = msg.topic(), msg.offset()
            if not self.batch_open:
                self.open_batch()
                self._started_at = dict(self.committed_offsets)
            i = index[topic]
            if topic in tables:
                tables[topic].apply(msg.key(), msg.value())
            else:
                state.begin_record()
                try:
                    outputs = checked_outputs("process", app.process(state, record_from_message(app, msg)))
                except Exception as error:  # decoding or user code: poison until proven otherwise
                    outputs = self._retry(msg, error)  # PoisonRecordStop: this record is in no run, no offset
                produced += self.add_outputs(outputs, offset, i)
            self._runs.note(i)
            nexts[topic] = offset + 1
            if i == 0:
                self.next_offset = offset + 1
            self.batch_records += 1
            processed += 1
        if processed:
            self.note_batch(merged, merged[processed - 1], processed, produced)

    # -- what the runner's commit writes of p ------------------------------------------------------------------------
    def advance_offset(self, cur: psycopg.Cursor) -> None:
        """The first input's row under the epoch check (a zombie fails here, before anything else), then every other
        topic's row and the order this transaction took, in the same transaction."""
        super().advance_offset(cur)
        ctx, p, epoch = self.ctx, self.partition, self.epoch
        others = [
            (ctx.app_id, topic, p, self.next_offsets[topic], epoch, ctx.owner)
            for topic in self.topics[1:]
            if self.next_offsets[topic] is not None
        ]
        if others:
            cur.executemany(self._sql_upsert_offset, others)
        if self._runs:
            start = Jsonb(self._started_at)
            cur.execute(self._sql_merge_order, (ctx.app_id, self.topics[0], p, epoch, start, self._runs.encode()))

    def batch_committed(self) -> None:
        super().batch_committed()
        for table in self.tables.values():
            table.commit()
        self.committed_offsets = dict(self.next_offsets)
        self._runs.clear()


def global_tables_for(app: App, settings: Settings, app_id: str, admin: AdminClient, metrics: Metrics) -> GlobalTables:
    """The App's global tables, read as the Kafka sink reads them (pipeline/state/global_tables.py)."""
    make_consumer = lambda: Consumer(restore_consumer_config(settings, f"{app_id}.global"))  # noqa: E731
    timeouts = (settings.request_timeout_ms / 1000, settings.restore_timeout_ms / 1000)
    return GlobalTables(app.global_table_specs, make_consumer, admin, metrics, *timeouts)


def table_restore_for(app: App, settings: Settings, app_id: str, admin: AdminClient, p: int) -> TableRestore:
    """Partition p's co-partitioned tables, read from their topics as the Kafka sink reads them."""
    make_consumer = lambda: Consumer(restore_consumer_config(settings, f"{app_id}.restore"))  # noqa: E731
    return TableRestore(make_consumer, admin, app.table_specs, p, settings.request_timeout_ms / 1000)
