"""The runner of the PostgreSQL sink: one consumer per process, one PostgresTask per owned input partition, and the
database transaction that commits each partition's batch (`commit_batch`, pipeline/sinks/postgres/commit.py).

Lifecycle of partition p in this process: the task's Phase (pipeline/core/lifecycle.py).
    assigned  -> take over: fence (bump epoch, read the offset) in the callback, assigned there, paused
                                                                                              NEW -> RESTORING
                 (database unusable: assigned paused; a new task takes p over later, with back-off)       NEW
    restoring -> the state rows read in pages between polls, within RESTORE_STEP_MS in all (docs/guarantees.md:
                 restore-keeps-membership); then the seek to the fenced offset, p resumed
                                                                  RESTORING -> REWINDING -> RUNNING
    running   -> records processed in memory, one database transaction per batch (interval / size)
    failed    -> a write failed (server gone, connection lost, unknown COMMIT outcome) or the epoch check failed
                 (fenced): the task is thrown away, p paused. After a back-off (bounded, doubling; fenced:
                 REFENCE_AFTER_S) a new task takes p over if the group still gives p to this process:
                 fence, then restore as above                                                 NEW -> RESTORING
    revoked   -> the open batch is committed, the task forgotten
    lost      -> the open batch is committed only if the epoch is still ours (the database decides, not the group
                 membership: if nobody fenced p yet, nothing was taken over and committing is correct)
    poison    -> on_poison=stop: what came before is committed, p stays paused                RUNNING -> STOPPED

Kafka's committed group offsets are written after each database commit (asynchronously) for lag monitoring only;
they are never read. The offsets table is the source of truth.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial

import psycopg_pool
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import Counter

from pipeline.app import App
from pipeline.core.configure import configured
from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.core.loop import BUSY_WAIT_S, IDLE_WAIT_S, REFENCE_AFTER_S, PollLoop
from pipeline.core.processing import InputRecordsDeleted, PoisonRecordStop
from pipeline.core.queries import Queries, own_address
from pipeline.kafka.acls import Names
from pipeline.kafka.clients import consumer_config
from pipeline.kafka.permissions import BEFORE_TOPICS, check_service
from pipeline.kafka.topics import partition_counts, require_inputs
from pipeline.retry import Backoff
from pipeline.settings import Settings
from pipeline.sinks.postgres.commit import commit_batch
from pipeline.sinks.postgres.inputs import PostgresMultiTask, global_tables_for, table_restore_for
from pipeline.sinks.postgres.queries import CommittedRows
from pipeline.sinks.postgres.schema import connection_kwargs, describe_dsn, prepare_database
from pipeline.sinks.postgres.tables import refuse_unfit, sink_of
from pipeline.sinks.postgres.task import Fenced, PostgresTask, PostgresTaskContext, WriteFailed
from pipeline.state.global_tables import GlobalTables, PendingTargets

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 0.1
POOL_WAIT_S = 2.0  # longest wait for a pooled connection: the loop must keep polling while the server is away
# Restoring, or waiting for the seek after the restore: p paused, the loop steps it (the schedule knows which).
TAKING_OVER = (Phase.RESTORING, Phase.REWINDING)


class PostgresRunner(PollLoop):
    commit_on_lost = True  # the epoch check, not the group membership, decides whether a batch may commit

    def __init__(self, app: App, settings: Settings) -> None:
        refuse_unfit(app, settings)
        super().__init__(settings)
        self.app = app = configured(app, settings)
        self.app_id = settings.app_id or app.name
        self.input_topic = app.input_topic
        self.topics = app.co_partitioned  # what task p reads partition p of: the inputs, then the tables
        self.sink = sink_of(app)
        self.db_errors = Counter(
            "pipeline_postgres_errors",
            "Failed database steps (take-over or batch)",
            ["partition"],
            registry=self.metrics.registry,
        )
        self.tasks: dict[int, PostgresTask] = {}
        self.global_tables: GlobalTables | None = None  # open() restores them, before joining the group
        self._awaiting_globals: dict[int, PendingTargets] = {}  # p restored, waits for the global tables' targets
        self._retry_at: dict[int, float] = {}  # p's task is NEW: take p over then
        self._failures: dict[int, int] = {}  # database failures of p in a row
        self._deleted_before_start: dict[int, tuple[str, str]] = {}  # p -> (topic, detail), reported while restoring
        self._backoff = Backoff(FIRST_BACKOFF_S, 2, settings.postgres_retry_backoff_max_ms / 1000)
        self._timeout_s = settings.request_timeout_ms / 1000
        self._admin: AdminClient | None = None  # open() makes it; the stall watchdog asks it for end offsets
        self.pool: psycopg_pool.ConnectionPool | None = None
        self._ctx: PostgresTaskContext | None = None
        self._threads = ThreadPoolExecutor(settings.postgres_pool_size, thread_name_prefix="pg-commit")
        self._query_rows: CommittedRows | None = None  # QUERY_ENABLED: the tables' reads (run() makes them)
        self._input_partition_count = 0  # open() reads it (queries place keys by it)

    @property
    def ctx(self) -> PostgresTaskContext:
        """What every task of this runner shares; open() makes it."""
        if self._ctx is None:
            raise RuntimeError("the runner is not open: open() makes the tasks' context")
        return self._ctx

    @ctx.setter
    def ctx(self, ctx: PostgresTaskContext) -> None:
        """With this loop's schedule, whoever made it: a task told another schedule would never be committed."""
        self._ctx = ctx if ctx.schedule is self.schedule else replace(ctx, schedule=self.schedule)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the input topic and the database (schema created or migrated), opens the pool and the consumer."""
        if self.consumer is not None:
            return
        s = self.settings
        self._admin = admin = AdminClient({"bootstrap.servers": s.bootstrap_servers, **s.kafka})
        global_topics = tuple(t.topic for t in self.app.global_table_specs.values())
        names = Names(self.app_id, self.input_topic, "", co_partitioned=self.topics[1:], global_tables=global_topics)
        check_service(admin, names, s, stateful=self.app.stateful, phase=BEFORE_TOPICS)
        needed = [*self.topics, *global_topics]
        self._input_partition_count = require_inputs(
            partition_counts(admin, self._timeout_s, needed), self.input_topic, self.topics[1:], global_topics
        )
        client_id = s.kafka.get("client.id", "")
        owner = f"{socket.gethostname()}:{os.getpid()}" + (f":{client_id}" if client_id else "")
        kwargs = connection_kwargs(s, f"pipeline {self.app_id} {owner}")
        version = prepare_database(s.postgres_dsn, kwargs, s.postgres_schema, self.sink.tables, 3 * self._timeout_s)
        self.pool = psycopg_pool.ConnectionPool(
            s.postgres_dsn,
            min_size=1,
            max_size=s.postgres_pool_size,
            kwargs={**kwargs, "autocommit": True},
            check=psycopg_pool.ConnectionPool.check_connection,
            name=f"pipeline-{self.app_id}",
            open=False,
        )
        self.pool.open(wait=False)
        if self.app.global_tables:  # before joining the group: before any task processes
            self.global_tables = global_tables_for(self.app, s, self.app_id, admin, self.metrics)
            self.global_tables.restore()
        self._ctx = PostgresTaskContext(
            self.app,
            s,
            self.app_id,
            self.input_topic,
            self.pool,
            self.sink,
            self.metrics,
            owner,
            pool_wait_s=min(POOL_WAIT_S, self._timeout_s),
            schedule=self.schedule,
            global_tables=self.global_tables.views if self.global_tables is not None else {},
            table_restore=partial(table_restore_for, self.app, s, self.app_id, admin) if self.app.table_specs else None,
        )
        self.consumer = Consumer(consumer_config(s, self.app_id))
        log.info(
            "%s: %s from %s into PostgreSQL %s schema %s (tables at version %d)",
            self.app_id,
            self.app.name,
            self.input_topic,
            describe_dsn(s.postgres_dsn),
            s.postgres_schema,
            version,
        )

    def _shutdown(self) -> None:
        for p in list(self.tasks):
            self._close_partition(p, commit=True)
        if self._query_rows is not None:
            self._query_rows.close()
        if self.consumer is not None:
            self._close_input()
        if self.global_tables is not None:
            self.global_tables.close()
        self._threads.shutdown()
        if self.pool is not None:
            self.pool.close(timeout=self._timeout_s)
        log.info("%s: stopped", self.app_id)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _loop_once(self) -> None:
        # Taking over: a task waits for its next try (NEW, in _retry_at), a restore step or a seek.
        busy = bool(self._retry_at) or bool(self.schedule.waiting(TAKING_OVER, self.tasks))
        messages = self._poll(BUSY_WAIT_S if busy else IDLE_WAIT_S)
        if self.global_tables is not None:  # before the records: what they read is at least as new as what they see
            self.global_tables.poll()
        self._dispatch(messages)
        self._commit_due()
        self._retry_pending()
        self._advance_restores()
        self._retry_seeks()
        self._update_gauges()

    def _dispatch(self, messages: list[Message]) -> None:
        """Each running task's records. With several inputs every task, every turn: an input waited for long enough
        lets the others' records go on (pipeline/core/merge.py)."""
        batches = self._by_partition(messages)
        for p in list(self.tasks if self.app.multi_input else batches):
            task = self.tasks.get(p)
            if task is not None and task.phase is Phase.RUNNING:
                try:
                    task.process(batches.get(p, []))
                except PoisonRecordStop as e:
                    self._poisoned(p, e)

    def _commit_due(self) -> None:
        due = self._to_commit(time.monotonic())
        # In parallel: one connection per partition; psycopg waits on the network without the GIL.
        results = [self._try_commit(due[0])] if len(due) == 1 else list(self._threads.map(self._try_commit, due))
        for p, error in zip(due, results, strict=True):
            if error is not None:
                self._failed(p, error)

    def _try_commit(self, p: int) -> Exception | None:
        task = self.tasks[p]
        try:
            commit_batch(task)
        except (Fenced, WriteFailed) as e:
            return e
        self._failures.pop(p, None)
        self._commit_group_offset(p, self._positions(task))
        return None

    def _commit_group_offset(self, p: int, offsets: dict[str, int | None]) -> None:
        """For lag monitoring only: never read back. Errors (e.g. a zombie's stale generation) are ignored."""
        tps = [TopicPartition(topic, p, offset) for topic, offset in offsets.items() if offset is not None]
        if not tps:
            return
        try:
            self.input.commit(offsets=tps, asynchronous=True)
        except KafkaException as e:
            log.debug("p%d: group offset not committed (monitoring only): %s", p, e)

    def _failed(self, p: int, error: Exception) -> None:
        """Nothing of the batch stayed. Throw the task away; take p over again later (fence, restore, seek)."""
        if isinstance(error, Fenced):
            self.metrics.fenced.inc()
            delay = REFENCE_AFTER_S
            log.warning(
                "p%d: fenced, batch rolled back: %s; taking p over again in %.1fs if still assigned", p, error, delay
            )
        else:
            self.db_errors.labels(str(p)).inc()
            delay = self._next_backoff(p)
            what = (
                "take-over (fence + restore) failed"
                if self.tasks[p].epoch is None
                else "PostgreSQL write failed, batch rolled back"
            )
            log.warning("p%d: %s: %s; retrying in %.1fs", p, what, error, delay)
        self._make_pending(p, delay)

    def _next_backoff(self, p: int) -> float:
        self._failures[p] = self._failures.get(p, 0) + 1
        return self._backoff.delay(self._failures[p])

    def _new_task(self, p: int) -> PostgresTask:
        return PostgresMultiTask(self.ctx, p) if self.app.multi_input else PostgresTask(self.ctx, p)

    def _make_pending(self, p: int, delay: float) -> None:
        if (failed := self.tasks.get(p)) is not None:
            failed.discard()
        self._awaiting_globals.pop(p, None)
        self.tasks[p] = self._new_task(p)  # NEW; in-memory state and pending rows of the failed one: gone
        self._retry_at[p] = time.monotonic() + delay
        self._pause(p)

    def _input_records_deleted(self, topic: str, p: int, detail: str) -> None:
        task = self.tasks.get(p)
        if task is not None and task.phase in (Phase.NEW, Phase.RESTORING, Phase.REWINDING):
            self._deleted_before_start[p] = (topic, detail)  # said once, at assignment: p stops once sought
            return
        if task is None or task.phase is not Phase.RUNNING:
            log.error("%s[%d]: position below the log start, p not running (%s)", topic, p, detail)
            return
        self._poisoned(p, InputRecordsDeleted(topic, p, task.next_offset, self.app_id, detail))

    def _poisoned(self, p: int, error: PoisonRecordStop) -> None:
        if (failure := self._try_commit(p)) is not None:  # what came before the poison record is good: keep it
            self._failed(p, failure)
            return
        self._stop_partition(self.tasks[p], error)

    def _retry_pending(self) -> None:
        now = time.monotonic()
        due = [p for p, at in self._retry_at.items() if at <= now]
        if not due:
            return
        assigned = {tp.partition for tp in self.input.assignment() if tp.topic == self.input_topic}
        for p in due:
            del self._retry_at[p]
            if p not in assigned:
                self._forget(p)
        due = [p for p in due if p in assigned]
        for p, result in zip(due, self._take_over_all(due), strict=True):
            if isinstance(result, Exception):
                self._failed(p, result)
            else:
                log.info("p%d: taken over again at offset %s (epoch %s); restoring", p, result, self.tasks[p].epoch)
        self._retry_seeks()

    def _advance_restores(self) -> None:
        """Steps every restore, about RESTORE_STEP_MS in all (docs/guarantees.md: restore-keeps-membership)."""
        restoring = self.schedule.waiting((Phase.RESTORING,), self.tasks)
        budget_s = self.settings.restore_step_ms / 1000 / max(1, len(restoring))
        for task in restoring:
            try:
                if task.restore_step(budget_s):
                    log.info("p%d restored: %d keys in %.2fs", task.partition, task.restored_keys, task.restore_seconds)
            except (Fenced, WriteFailed) as e:
                self._failed(task.partition, e)

    def _retry_seeks(self) -> None:
        """Restored (REWINDING): seek to the fenced offset, then resume. The position never comes from the fetcher
        (docs/guarantees.md: rewind-after-abort): records of p fetched while p restored were dropped by _dispatch."""
        for task in self.schedule.waiting((Phase.REWINDING,), self.tasks):
            p = task.partition
            if not self._globals_reached(p):
                continue
            if (deleted := self._deleted_before_start.pop(p, None)) is not None:  # no position to seek to
                topic, detail = deleted
                self._stop_partition(task, InputRecordsDeleted(topic, p, task.committed_offset, self.app_id, detail))
            elif task.try_seek_back(self.input):
                self._resume(p)
                log.info("p%d: reading from offset %s (epoch %s)", p, task.committed_offset, task.epoch)

    # -- assignment --------------------------------------------------------------------------------------------------
    def _take_over_all(self, partitions: list[int]) -> list[int | Exception | None]:
        """Fences each partition and reads its offset (in parallel, each on its own connection): the offset, or the
        error. The state follows between polls (_advance_restores)."""
        tasks = [self._new_task(p) for p in partitions]
        for task in tasks:
            self.tasks[task.partition] = task
        if self.global_tables is not None:  # asked without waiting; p starts once the tables reached them
            targets = self.global_tables.ask_targets()
            self._awaiting_globals.update(dict.fromkeys(partitions, targets))

        def take_over(task: PostgresTask) -> int | Exception | None:
            try:
                return task.fence()
            except WriteFailed as e:
                return e

        return list(self._threads.map(take_over, tasks))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        ps = [tp.partition for tp in partitions]
        results = self._take_over_all(ps)
        assignment, failed = [], []
        for p, result in zip(ps, results, strict=True):
            if isinstance(result, Exception):
                failed.append((p, result))  # assigned paused at the beginning: sought once taken over
            assignment += [
                TopicPartition(topic, p, OFFSET_BEGINNING if offset is None else offset)
                for topic, offset in self._positions(self.tasks[p]).items()
            ]
        consumer.incremental_assign(assignment)
        taken = [p for p in ps if self.tasks[p].phase is Phase.RESTORING]
        for p in taken:
            self._pause(p)  # until restored (a pause survives unassign/assign: resumed after the seek)
        for p, error in failed:
            self._failed(p, error)
        self.metrics.assigned.set(len(self.tasks))
        log.info(
            "assigned %s: offsets from the database %s, epochs %s; restoring their state",
            ps,
            {p: self.tasks[p].committed_offset for p in taken},
            {p: self.tasks[p].epoch for p in taken},
        )

    def _owned_partitions(self) -> dict[int, PostgresTask]:
        return self.tasks

    def _positions(self, owned: Lifecycle) -> dict[str, int | None]:
        """Every topic's next offset (several inputs: each of them and the tables)."""
        if isinstance(owned, PostgresMultiTask):
            return dict(owned.next_offsets)
        return {self.input_topic: owned.next_offset}

    def _topic_partitions(self, p: int) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for topic in self.topics]

    # -- tables (docs/inputs.md) --------------------------------------------------------------------------------------
    def _globals_reached(self, p: int) -> bool:
        """Whether p may start: every global table read up to the high watermarks asked at its take-over, so that
        what p reads never goes back in time across owners (docs/guarantees.md: table-reads-forward)."""
        pending = self._awaiting_globals.get(p)
        if pending is None or self.global_tables is None:
            return True
        targets = pending.result()
        if targets is None or not self.global_tables.reached(targets):
            return False
        del self._awaiting_globals[p]
        return True

    def _queries(self) -> Queries:
        """Owned partitions from memory, the others from the tables (pipeline/sinks/postgres/queries.py)."""
        self._query_rows = CommittedRows(self.settings, self.app_id, self.input_topic)
        address, count = own_address(self.settings), self._input_partition_count
        return Queries(self.app, self.settings, self.tasks, lambda: count, address=address, rows=self._query_rows)

    def _admin_client(self) -> AdminClient | None:
        return self._admin

    def _restore_progress(self, p: int) -> object:
        return self.tasks[p].restore_progress

    def _stall_detail(self, p: int) -> list[str]:
        """A take-over waits for PostgreSQL: its retries, its restore."""
        task = self.tasks[p]
        if p in self._retry_at:
            failures = self._failures.get(p, 0)
            left = max(0.0, self._retry_at[p] - time.monotonic())
            return [f"taken over again in {left:.1f} s ({failures} failures in a row): is PostgreSQL reachable?"]
        if task.phase is Phase.RESTORING:
            return [f"restoring its state rows from PostgreSQL: {len(task.state)} keys read"]
        return ["waiting for the global tables to reach their targets"] if p in self._awaiting_globals else []

    def _close_partition(self, p: int, commit: bool) -> None:
        task = self.tasks.get(p)
        if task is not None and commit and task.phase is Phase.RUNNING:
            try:
                commit_batch(task)
            except (Fenced, WriteFailed) as e:
                log.warning(
                    "p%d: not committed on close (%d records left to the next owner): %s", p, task.batch_records, e
                )
        self._forget(p)
        if len(self.topics) > 1 and self.consumer is not None:
            # Every topic of p, the group's too (as the Kafka sink does: docs/guarantees.md, several-inputs): once a
            # revoke callback unassigns anything itself, librdkafka leaves the rest to it.
            self.input.incremental_unassign(self._topic_partitions(p))

    def _forget(self, p: int) -> None:
        self._awaiting_globals.pop(p, None)
        if (task := self.tasks.pop(p, None)) is not None:
            task.discard()
            self.metrics.forget_partition(p, self.topics)
        self._retry_at.pop(p, None)
        self._failures.pop(p, None)
        self._deleted_before_start.pop(p, None)

    def _pause(self, p: int) -> None:
        try:
            super()._pause(p)
        except KafkaException as e:  # p no longer assigned, say: a paused partition of nobody's is no harm
            log.info("p%d: pause: %s", p, e)
