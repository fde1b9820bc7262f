"""The runner of the PostgreSQL sink: one consumer per process, one PgWorker per owned input partition.

Lifecycle of partition p in this process: the worker's Phase (pipeline/lifecycle.py), moved by its methods.
    assigned  -> take over: fence (bump epoch, read the offset) in the callback, assigned there, paused
                                                                                              NEW -> RESTORING
                 (database unusable: assigned paused; a new worker takes p over later, with back-off)       NEW
    restoring -> the state rows read in pages between polls, within RESTORE_STEP_MS in all (docs/guarantees.md:
                 restore-keeps-membership); then the seek to the fenced offset, p resumed
                                                                  RESTORING -> REWINDING -> RUNNING
    running   -> records processed in memory, one database transaction per batch (interval / size)
    failed    -> a write failed (server gone, connection lost, unknown COMMIT outcome) or the epoch check failed
                 (fenced): the worker is thrown away, p paused. After a back-off (bounded, doubling; fenced:
                 REFENCE_AFTER_S) a new worker takes p over if the group still gives p to this process:
                 fence, then restore as above                                                 NEW -> RESTORING
    revoked   -> the open batch is committed, the worker forgotten
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

import psycopg_pool
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import Counter

from pipeline.app import App
from pipeline.kafka.acls import Names
from pipeline.kafka.clients import consumer_config
from pipeline.kafka.permissions import BEFORE_TOPICS, check_service
from pipeline.kafka.topics import partition_counts
from pipeline.lifecycle import Phase
from pipeline.loop import BUSY_WAIT_S, IDLE_WAIT_S, REFENCE_AFTER_S, PollLoop
from pipeline.postgres.schema import connection_kwargs, describe_dsn, prepare_database
from pipeline.postgres.sink import sink_of
from pipeline.postgres.worker import Fenced, PgWorker, WorkerContext, WriteFailed
from pipeline.processing import PoisonRecordStop
from pipeline.settings import ConfigError, Settings

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 0.1
POOL_WAIT_S = 2.0  # longest wait for a pooled connection: the loop must keep polling while the server is away
# Waiting for a take-over, restoring, or waiting for the seek after one: p paused.
TAKING_OVER = (Phase.NEW, Phase.RESTORING, Phase.REWINDING)


class PgRunner(PollLoop):
    commit_on_lost = True  # the epoch check, not the group membership, decides whether a batch may commit

    def __init__(self, app: App, settings: Settings) -> None:
        if settings.sink != "postgres":
            raise ConfigError(f"PgRunner needs SINK=postgres, not {settings.sink!r}")
        if app.extended_state:  # its state rows have no place for them (docs/guarantees.md: timers-exactly-once)
            raise ConfigError(
                f"{app.name}: timers, state TTL and state versions (on_timer, state_ttl_ms, "
                "state_version) are Kafka-mode only; SINK=postgres cannot run this App"
            )
        super().__init__(settings)
        self.app = app
        self.app_id = settings.app_id or app.name
        self.input_topic = settings.input_topic or app.input_topic
        self.sink = sink_of(app)
        self.db_errors = Counter(
            "pipeline_postgres_errors",
            "Failed database steps (take-over or batch)",
            ["partition"],
            registry=self.metrics.registry,
        )
        self.workers: dict[int, PgWorker] = {}
        self._retry_at: dict[int, float] = {}  # p's worker is NEW: take p over then
        self._backoff: dict[int, float] = {}
        self._timeout_s = settings.request_timeout_ms / 1000
        self.pool: psycopg_pool.ConnectionPool | None = None
        self.ctx: WorkerContext | None = None
        self._threads = ThreadPoolExecutor(settings.postgres_pool_size, thread_name_prefix="pg-commit")

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the input topic and the database (schema created or migrated), opens the pool and the consumer."""
        if self.consumer is not None:
            return
        s = self.settings
        admin = AdminClient({"bootstrap.servers": s.bootstrap_servers, **s.kafka})
        check_service(
            admin, Names(self.app_id, self.input_topic, ""), s, stateful=self.app.stateful, phase=BEFORE_TOPICS
        )
        if self.input_topic not in partition_counts(admin, self._timeout_s, needed=[self.input_topic]):
            raise ConfigError(
                f"INPUT_TOPIC: topic {self.input_topic!r} does not exist (create it: pipeline topics create ...)"
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
        self.ctx = WorkerContext(
            self.app,
            s,
            self.app_id,
            self.input_topic,
            self.pool,
            self.sink,
            self.metrics,
            owner,
            pool_wait_s=min(POOL_WAIT_S, self._timeout_s),
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
        for p in list(self.workers):
            self._close_partition(p, commit=True)
        if self.consumer is not None:
            self.consumer.close()
        self._threads.shutdown()
        if self.pool is not None:
            self.pool.close(timeout=self._timeout_s)
        log.info("%s: stopped", self.app_id)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _loop_once(self) -> None:
        busy = any(worker.phase in TAKING_OVER for worker in self.workers.values())
        messages = self._poll(BUSY_WAIT_S if busy else IDLE_WAIT_S)
        self._dispatch(messages)
        self._commit_due()
        self._retry_pending()
        self._advance_restores()
        self._retry_seeks()
        self._update_gauges()

    def _dispatch(self, messages: list[Message]) -> None:
        for p, batch in self._by_partition(messages).items():
            worker = self.workers.get(p)
            if worker is not None and worker.phase is Phase.RUNNING:
                try:
                    worker.process(batch)
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
        worker = self.workers[p]
        try:
            worker.commit()
        except (Fenced, WriteFailed) as e:
            return e
        self._backoff.pop(p, None)
        self._commit_group_offset(p, worker.committed_offset)
        return None

    def _commit_group_offset(self, p: int, offset: int | None) -> None:
        """For lag monitoring only: never read back. Errors (e.g. a zombie's stale generation) are ignored."""
        if offset is None:
            return
        try:
            self.consumer.commit(offsets=[TopicPartition(self.input_topic, p, offset)], asynchronous=True)
        except KafkaException as e:
            log.debug("p%d: group offset not committed (monitoring only): %s", p, e)

    def _failed(self, p: int, error: Exception) -> None:
        """Nothing of the batch stayed. Throw the worker away; take p over again later (fence, restore, seek)."""
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
                if self.workers[p].epoch is None
                else "PostgreSQL write failed, batch rolled back"
            )
            log.warning("p%d: %s: %s; retrying in %.1fs", p, what, error, delay)
        self._make_pending(p, delay)

    def _next_backoff(self, p: int) -> float:
        delay = self._backoff.get(p, FIRST_BACKOFF_S / 2) * 2
        delay = min(delay, self.settings.postgres_retry_backoff_max_ms / 1000)
        self._backoff[p] = delay
        return delay

    def _make_pending(self, p: int, delay: float) -> None:
        self.workers[p] = PgWorker(self.ctx, p)  # NEW; in-memory state and pending rows of the failed one: gone
        self._retry_at[p] = time.monotonic() + delay
        self._pause(p)

    def _poisoned(self, p: int, error: PoisonRecordStop) -> None:
        if (failure := self._try_commit(p)) is not None:  # what came before the poison record is good: keep it
            self._failed(p, failure)
            return
        self._stop_partition(self.workers[p], error)

    def _retry_pending(self) -> None:
        now = time.monotonic()
        due = [p for p, at in self._retry_at.items() if at <= now]
        if not due:
            return
        assigned = {tp.partition for tp in self.consumer.assignment() if tp.topic == self.input_topic}
        for p in due:
            del self._retry_at[p]
            if p not in assigned:
                self._forget(p)
        due = [p for p in due if p in assigned]
        for p, result in zip(due, self._take_over_all(due), strict=True):
            if isinstance(result, Exception):
                self._failed(p, result)
            else:
                log.info("p%d: taken over again at offset %s (epoch %s); restoring", p, result, self.workers[p].epoch)
        self._retry_seeks()

    def _advance_restores(self) -> None:
        """Steps every restore, about RESTORE_STEP_MS in all (docs/guarantees.md: restore-keeps-membership)."""
        restoring = [worker for worker in self.workers.values() if worker.phase is Phase.RESTORING]
        budget_s = self.settings.restore_step_ms / 1000 / max(1, len(restoring))
        for worker in restoring:
            try:
                if worker.restore_step(budget_s):
                    log.info(
                        "p%d restored: %d keys in %.2fs", worker.partition, worker.restored_keys, worker.restore_seconds
                    )
            except (Fenced, WriteFailed) as e:
                self._failed(worker.partition, e)

    def _retry_seeks(self) -> None:
        """Restored (REWINDING): seek to the fenced offset, then resume. The position never comes from the fetcher
        (docs/guarantees.md: rewind-after-abort): records of p fetched while p restored were dropped by _dispatch."""
        for p, worker in list(self.workers.items()):
            if worker.phase is not Phase.REWINDING:
                continue
            offset = OFFSET_BEGINNING if worker.committed_offset is None else worker.committed_offset
            try:
                self.consumer.seek(TopicPartition(self.input_topic, p, offset))
            except KafkaException as e:
                log.info("p%d: seek to %s not possible yet (%s); retrying", p, offset, e)
                continue
            worker.positioned()
            self.consumer.resume([TopicPartition(self.input_topic, p)])
            log.info("p%d: reading from offset %s (epoch %s)", p, offset, worker.epoch)

    # -- assignment --------------------------------------------------------------------------------------------------
    def _take_over_all(self, partitions: list[int]) -> list[int | Exception | None]:
        """Fences each partition and reads its offset (in parallel, each on its own connection): the offset, or the
        error. The state follows between polls (_advance_restores)."""
        workers = [PgWorker(self.ctx, p) for p in partitions]
        for worker in workers:
            self.workers[worker.partition] = worker

        def take_over(worker: PgWorker) -> int | Exception | None:
            try:
                return worker.fence()
            except WriteFailed as e:
                return e

        return list(self._threads.map(take_over, workers))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        ps = [tp.partition for tp in partitions]
        results = self._take_over_all(ps)
        assignment, failed = [], []
        for p, result in zip(ps, results, strict=True):
            if isinstance(result, Exception):
                failed.append((p, result))
                assignment.append(TopicPartition(self.input_topic, p, OFFSET_INVALID))
            else:
                assignment.append(TopicPartition(self.input_topic, p, OFFSET_BEGINNING if result is None else result))
        consumer.incremental_assign(assignment)
        taken = [p for p in ps if self.workers[p].phase is Phase.RESTORING]
        for p in taken:
            self._pause(p)  # until restored (a pause survives unassign/assign: resumed after the seek)
        for p, error in failed:
            self._failed(p, error)
        self.metrics.assigned.set(len(self.workers))
        log.info(
            "assigned %s: offsets from the database %s, epochs %s; restoring their state",
            ps,
            {p: self.workers[p].committed_offset for p in taken},
            {p: self.workers[p].epoch for p in taken},
        )

    def _owned_partitions(self) -> dict[int, PgWorker]:
        return self.workers

    def _close_partition(self, p: int, commit: bool) -> None:
        worker = self.workers.get(p)
        if worker is not None and commit and worker.phase is Phase.RUNNING:
            try:
                worker.commit()
            except (Fenced, WriteFailed) as e:
                log.warning("p%d: not committed on close (%d records left to the next owner): %s", p, worker.pending, e)
        self._forget(p)

    def _forget(self, p: int) -> None:
        if self.workers.pop(p, None) is not None:
            self.metrics.forget_partition(p)
        self._retry_at.pop(p, None)
        self._backoff.pop(p, None)

    def _pause(self, p: int) -> None:
        try:
            super()._pause(p)
        except KafkaException as e:  # p no longer assigned, say: a paused partition of nobody's is no harm
            log.info("p%d: pause: %s", p, e)
