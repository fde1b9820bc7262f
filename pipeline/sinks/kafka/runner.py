"""The runner of the Kafka sink: one consumer per process, one KafkaTask per owned input partition, and the
transactions they stage their work in. The runner builds every transaction (`_transaction_for`) and decides when to
commit or abort it (the protocol itself: pipeline/sinks/kafka/commit.py); tasks only process records and stage state.

Lifecycle of partition p in this process: the task's Phase (pipeline/core/lifecycle.py).
    assigned  -> fence (init_transactions) -> read committed offset -> assign at that offset              NEW
                 (pipeline/sinks/kafka/takeover.py)
    restoring -> p paused; the changelog read in short steps between polls (self.restores)     NEW -> RESTORING
    running   -> restored, sought back to the committed offset, p resumed (a stateless app starts here);
                 records processed into transactions, committed on interval/size     RESTORING (or NEW) -> RUNNING
    aborted   -> state undone, seek back to the committed offset               RUNNING -> REWINDING -> RUNNING
    poison    -> on_poison=stop: what came before is committed, p paused                    RUNNING -> STOPPED
    fenced    -> nothing committed, p paused; after REFENCE_AFTER_S a new task fences and restores p again
                 if the group still gives it to us                                          RUNNING -> DROPPED
    revoked   -> open transaction committed, producer flushed, state dropped                          -> CLOSED
    lost      -> open transaction aborted (someone else owns p now), producer flushed                 -> CLOSED
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient

from pipeline.app import App
from pipeline.core.configure import configured
from pipeline.core.deadletter import dead_letter_topic
from pipeline.core.lifecycle import Phase
from pipeline.core.loop import BUSY_WAIT_S, IDLE_WAIT_S, REFENCE_AFTER_S, PollLoop
from pipeline.core.processing import InputRecordsDeleted, PoisonRecordStop
from pipeline.core.queries import Queries, StandbyReads, own_address
from pipeline.kafka.acls import Names
from pipeline.kafka.clients import client_config, consumer_config, producer_config, restore_consumer_config
from pipeline.kafka.kafka_python import quick_fence
from pipeline.kafka.liveness import Liveness
from pipeline.serde import background_registry_lookups
from pipeline.settings import PER_PROCESS, Settings
from pipeline.sinks.kafka import takeover
from pipeline.sinks.kafka.commit import abort_and_rewind, abort_transaction, close_task, commit_transaction
from pipeline.sinks.kafka.inputs import MultiInputTask
from pipeline.sinks.kafka.snapshot import publish_shutdown_snapshot
from pipeline.sinks.kafka.takeover import TakeOver
from pipeline.sinks.kafka.task import KafkaTask, KafkaTaskContext, registry_wait_over
from pipeline.sinks.kafka.transaction import (
    Deliveries,
    PartitionDropped,
    Transaction,
    TransactionAborted,
    process_transactional_id,
    transactional_id,
)
from pipeline.state.changelog import changelog_topic
from pipeline.state.disk_store import StoreFull, disk_failed
from pipeline.state.global_tables import PendingTargets
from pipeline.state.local_stores import local_stores
from pipeline.state.restore import ChangelogRestore
from pipeline.state.restore_manager import RestoreManager
from pipeline.state.snapshot_format import snapshot_topic

log = logging.getLogger(__name__)
COMMIT_THREADS = 64  # the most transactions committed at once (PRODUCERS=per_partition)


class KafkaRunner(TakeOver, PollLoop):
    def __init__(self, app: App, settings: Settings, abort_hook: Callable[[int], bool] | None = None) -> None:
        super().__init__(settings)
        self.app = app = configured(app, settings)
        self.app_id = settings.app_id or app.name
        self.input_topic, self.output_topic = app.input_topic, app.output_topic
        self.topics = app.co_partitioned  # what task p reads partition p of: the inputs, then the tables
        self.changelog_topic = settings.changelog_topic or changelog_topic(self.app_id)
        self.snapshot_topic = settings.snapshot_topic or snapshot_topic(self.app_id)
        self.dead_letter_topic = settings.dead_letter_topic or dead_letter_topic(self.app_id)
        self.tasks: dict[int, KafkaTask] = {}
        self._dropped_at: dict[int, float] = {}
        if abort_hook is None and settings.test_abort_every > 0:
            every = settings.test_abort_every
            abort_hook = lambda n: n % every == 0  # noqa: E731
        self._abort_hook = abort_hook
        self.admin = AdminClient(client_config(settings))
        self.local_stores = local_stores(app, settings, self.app_id, self.metrics.registry)  # STATE_STORE=disk
        self.restores = RestoreManager(
            settings,
            self.changelog_topic,
            self.snapshot_topic,
            app.state_serde,
            self._make_restore_consumer,
            lambda: AdminClient(client_config(settings)),
            self.admin,
            app.table_specs,
            self.local_stores,
        )
        self.global_tables = self._global_tables() if app.global_tables else None
        self._awaiting_globals: dict[int, tuple[PendingTargets, ChangelogRestore | None]] = {}
        self._deleted_before_start: dict[int, tuple[str, str]] = {}
        self._ctx: KafkaTaskContext | None = None
        self._process_txn: Transaction | None = None  # PRODUCERS=per_process: the one producer's transaction
        self._process_txn_id = process_transactional_id(self.app_id, self.input_topic, settings.group_instance_id)
        # PRODUCERS=per_partition: every open transaction commits in the same round, each waiting on the broker with
        # the GIL released. 4 threads committed the ~10 transactions of a round at 384 partitions in three waves
        # (the loop stalled 4.4 s of a 12 s drain; 2.7 s with 64). Threads start only as needed: one transaction
        # (per_process) commits on the loop's own thread.
        self._commit_pool = ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="commit")
        self.liveness: Liveness | None = None  # FAILURE_DETECTION_MS: the heartbeat thread
        self._input_partition_count: int | None = None  # QUERY_ENABLED: asked once, by the first query
        self._serving_told_at = 0.0

    @property
    def ctx(self) -> KafkaTaskContext:
        """What every task of this runner shares; open() makes it."""
        if self._ctx is None:
            raise RuntimeError("the runner is not open: open() makes the tasks' context")
        return self._ctx

    @ctx.setter
    def ctx(self, ctx: KafkaTaskContext) -> None:
        """With this loop's schedule, whoever made it: a task told another schedule would never be committed."""
        self._ctx = ctx if ctx.schedule is self.schedule else replace(ctx, schedule=self.schedule)

    # -- clients and transactions ------------------------------------------------------------------------------------
    def _make_producer(self, txn_id: str | None, on_delivery: Callable[[Any, Any], None] | None = None) -> Producer:
        return Producer(producer_config(self.settings, txn_id, on_delivery))

    def _make_restore_consumer(self) -> Consumer:
        return Consumer(restore_consumer_config(self.settings, f"{self.app_id}.restore"))

    def _transaction_for(self, p: int) -> Transaction:
        """The transaction p's task stages its work in: the process's (PRODUCERS=per_process), or p's own, on a
        producer named after p."""
        if self.settings.producers == PER_PROCESS:
            return self._process_transaction()
        return self._new_transaction(transactional_id(self.app_id, self.input_topic, p), f"p{p}")

    def _process_transaction(self) -> Transaction:
        """PRODUCERS=per_process: the process's producer, replaced (same transactional.id) once it is broken."""
        if self._process_txn is None or self._process_txn.broken:
            self._process_txn = self._new_transaction(self._process_txn_id)
        return self._process_txn

    def _new_task(self, p: int) -> KafkaTask:
        task_type = MultiInputTask if self.app.multi_input else KafkaTask
        return task_type(self.ctx, p, self._transaction_for(p))

    def _new_transaction(self, txn_id: str, name: str | None = None) -> Transaction:
        deliveries = Deliveries()  # every producer of this transaction reports to it (a renewed one too)
        make = partial(self._make_producer, txn_id if self.settings.exactly_once else None, deliveries.report)
        observe = self.metrics.commit_latency.observe
        quick = partial(quick_fence, self.settings, txn_id)  # not when many are fenced at once (takeover.fence)
        return Transaction(make(), self.settings, name or txn_id, self._abort_hook, observe, make, quick, deliveries)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the topics and creates the consumer; `run()` calls it."""
        if self.consumer is not None:
            return
        names = Names(
            self.app_id,
            self.input_topic,
            self.output_topic,
            self.changelog_topic,
            self.snapshot_topic,
            self.dead_letter_topic,
            self.topics[1:],
            tuple(t.topic for t in self.app.global_table_specs.values()),
        )
        takeover.prepare_topics(self.admin, names, self.settings, self.app.stateful)
        # Beating from here on, before the slow steps (global tables, the fence, joining): a restarted static member's
        # peers hear its new incarnation before the old one's silence reaches the bound, and leave its place to it.
        self.liveness = takeover.start_liveness(self.settings, self.app_id, self._process_txn_id)
        self.on_join = self._joined
        if self.global_tables is not None:  # before joining the group: before any task processes
            self.global_tables.restore()
        self.consumer = Consumer(consumer_config(self.settings, self.app_id))
        self.standbys = self._standbys()
        self._ctx = KafkaTaskContext(
            self.app,
            self.settings,
            self.app_id,
            self.input_topic,
            self.output_topic,
            self.changelog_topic,
            self.dead_letter_topic,
            self.input,
            self.metrics,
            global_tables=self.global_tables.views if self.global_tables is not None else {},
            schedule=self.schedule,
        )
        if self.settings.producers == PER_PROCESS:  # fenced once, before any partition is assigned (fence-first)
            takeover.fence([self._process_transaction()], self.settings)

    def run(self) -> None:
        s = self.settings
        log.info(
            "%s: %s from %s to %s (%s, producers %s); kafka settings %s",
            self.app_id,
            self.app.name,
            self.input_topic,
            self.output_topic,
            s.processing_guarantee,
            s.producers,
            s.redacted_kafka(),
        )
        super().run()

    def _shutdown(self) -> None:
        for p in list(self.tasks):
            if self.settings.snapshot_on_shutdown:
                self._commit(self.tasks[p].txn)  # what is open first; then the state as it is committed
                publish_shutdown_snapshot(self.tasks[p], self.snapshot_topic)
            self._close_partition(p, commit=True)
        if self.consumer is not None:
            # Leaves the group (a static member does not: its partitions wait for it until the session times out).
            self._close_input()
        if self.liveness is not None:  # after leaving: its last heartbeat says it stopped cleanly
            self.liveness.stop()
        for reader in (self.global_tables, self.standbys):
            if reader is not None:
                reader.close()
        self._commit_pool.shutdown()
        if self.local_stores is not None:
            self.local_stores.close()
        log.info("%s: stopped", self.app_id)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _loop_once(self) -> None:
        holding = self.app.timed and any(t.holding for t in self.tasks.values())  # timers walk them every turn anyway
        busy = self._restoring() or bool(self._seeking()) or holding
        messages = self._poll(BUSY_WAIT_S if busy else IDLE_WAIT_S)
        if self.global_tables is not None:  # before the records: what they read is at least as new as what they see
            self.global_tables.poll()
        self._dispatch(messages)
        self._tick_timers()
        self._commit_due()
        self._advance_restores()
        self._retry_rewinds_and_drops()
        self._end_registry_waits()
        self._update_gauges()
        self._tell_directory()

    def _dispatch(self, messages: list[Message]) -> None:
        """Each partition's batch to its task, then each transaction that took some serves its delivery reports
        (once per poll, not per partition batch: see KafkaTask._process)."""
        batches = self._by_partition(messages)
        polled_at = {p: task.seeks for p in batches if (task := self.tasks.get(p)) is not None}
        took: dict[int, KafkaTask] = {}  # id(transaction) -> a task in it
        # KafkaTask.process's, set once here (several inputs wait for the registry inline: left off for them)
        background = background_registry_lookups.set(not self.app.multi_input)
        try:
            for p, batch in batches.items():
                task = self.tasks.get(p)
                # Not after a seek back since the poll (docs/guarantees.md: rewind-after-abort): with one transaction
                # for the process, an abort while an earlier partition's batch ran rewinds this one too, and its batch
                # continues from the old position: handing it over would skip the records in between.
                if task is not None and task.phase is Phase.RUNNING and task.seeks == polled_at[p]:
                    self._guarded(task, task.process, batch)
                    took[id(task.txn)] = task
        finally:
            background_registry_lookups.reset(background)
        for task in took.values():
            if not task.txn.broken:
                self._guarded(task, task.txn.poll)

    def _tick_timers(self) -> None:
        """Wall-clock timers fire even when no record arrives, and a burst of due stream timers goes on, both bounded
        per turn (docs/guarantees.md: timers-exactly-once); with several inputs, an input waited for long enough
        lets the others' records go on."""
        if not (self.app.timed or self.app.multi_input) or self._ctx is None:
            return
        now_ms = self.ctx.wall_clock()
        for task in list(self.tasks.values()):
            if task.phase is Phase.RUNNING:
                self._guarded(task, task.tick, now_ms)

    def _commit_due(self) -> None:
        """Every open transaction once one is due: the process's one, or one per partition, committed in parallel
        (commits wait on the network and release the GIL)."""
        due = [self.tasks[p].txn for p in self._to_commit(time.monotonic())]
        txns = list({id(txn): txn for txn in due if txn.open}.values())
        if len(txns) == 1:
            self._commit(txns[0])
        elif txns:
            list(self._commit_pool.map(self._commit, txns))
        if self.local_stores is not None:  # STATE_STORE=disk: a batch the disk refused stops its partition now
            for task in [t for t in self.tasks.values() if t.phase is Phase.RUNNING and disk_failed(t.state)]:
                self._disk_full(task, StoreFull(str(disk_failed(task.state))))

    def _commit(self, txn: Transaction) -> None:
        """commit_transaction, and what its failure means for the tasks in it."""
        tasks = list(txn.participants)
        try:
            commit_transaction(txn, self.input)
        except TransactionAborted as e:
            log.warning("%s: transaction aborted (%s); rewinding %s", txn.name, e, [t.partition for t in tasks])
            self._abort(txn)
        except PartitionDropped as e:
            self._drop(txn, str(e))

    def _abort(self, txn: Transaction) -> None:
        try:
            abort_transaction(txn)
        except (TransactionAborted, PartitionDropped) as again:
            self._drop(txn, str(again))

    def _guarded(self, task: KafkaTask, step: Callable[..., None], *args: Any) -> None:
        """Runs one step of a task and turns its failures into the task's transitions (docs/guarantees.md:
        rewind-after-abort, unknown-commit-retried, no-silent-skip)."""
        try:
            step(*args)
        except TransactionAborted as e:
            log.warning(
                "p%d: transaction aborted (%s); rewinding to offset %s", task.partition, e, task.committed_offset
            )
            try:
                abort_and_rewind(task)
            except (TransactionAborted, PartitionDropped) as again:
                self._drop(task.txn, str(again))
        except PartitionDropped as e:
            self._drop(task.txn, str(e))
        except PoisonRecordStop as e:
            self._commit_then_stop(task, e)
        except StoreFull as e:  # STATE_STORE=disk: p stops (its disk is behind, which the changelog makes safe)
            self._disk_full(task, e)

    def _disk_full(self, task: KafkaTask, error: StoreFull) -> None:
        stop = PoisonRecordStop(str(error))
        stop.fix = error.fix
        self._commit_then_stop(task, stop)

    def _commit_then_stop(self, task: KafkaTask, error: PoisonRecordStop) -> None:
        self._commit(task.txn)  # what came before the poison record (or the deleted ones) is good: keep it
        if task.phase is not Phase.DROPPED:  # dropped by that commit: taken over again, and stopped then
            self._stop_partition(task, error)

    def _input_records_deleted(self, topic: str, p: int, detail: str) -> None:
        task = self.tasks.get(p)
        if task is not None and task.phase in (Phase.NEW, Phase.RESTORING):
            # librdkafka checks the position as soon as p is assigned, paused or not, and says it once: p stops
            # when its restore ends (without this, p ran on with a fetcher that never fetched again)
            self._deleted_before_start[p] = (topic, detail)
            return
        if task is None or task.phase not in (Phase.RUNNING, Phase.REWINDING):
            log.error("%s[%d]: position below the log start, p not running (%s)", topic, p, detail)
            return
        position = self._positions(task).get(topic)
        self._commit_then_stop(task, InputRecordsDeleted(topic, p, position, self.app_id, detail))

    def _drop(self, txn: Transaction, reason: str) -> None:
        """Drops every task whose work went through `txn`'s producer, which can never commit again (one task; or,
        PRODUCERS=per_process, all the running ones); each is taken over again after REFENCE_AFTER_S, with a new
        producer."""
        for task in [t for t in self.tasks.values() if t.txn is txn and t.phase in (Phase.RUNNING, Phase.REWINDING)]:
            log.warning("p%d: dropped without committing: %s", task.partition, reason)
            task.drop(reason)
            self.metrics.fenced.inc()
            self._pause(task.partition)
            self._dropped_at[task.partition] = time.monotonic()

    def _seeking(self) -> list[KafkaTask]:
        """The tasks waiting for their seek back (REWINDING): the schedule knows them, no partition is asked."""
        return self.schedule.waiting((Phase.REWINDING,), self.tasks)

    def _retry_rewinds_and_drops(self) -> None:
        for task in self._seeking():
            task.try_seek_back(self.input)
        now = time.monotonic()
        for p, dropped_at in list(self._dropped_at.items()):
            if now - dropped_at < REFENCE_AFTER_S:
                continue
            del self._dropped_at[p]
            if p in self.tasks and self.tasks[p].phase is Phase.DROPPED:
                # Still ours per the group: a new producer fences whatever is left and the state is restored.
                log.info("p%d: still assigned after being dropped; taking it over again", p)
                self.tasks.pop(p)
                self._take_over([p], reassign=True)

    def _end_registry_waits(self) -> None:
        """Partitions paused for the schema registry whose back-off is over, or whose look-up answered, are fetched
        again."""
        waits = self._ctx.registry_waits if self._ctx is not None else None
        if not waits:
            return
        now = time.monotonic()
        for p, until in list(waits.items()):
            if not registry_wait_over(until, now):
                continue
            task = self.tasks.get(p)
            if task is None:
                del waits[p]
            else:
                task.end_registry_wait()

    # -- interactive queries (pipeline/core/queries.py) ---------------------------------------------------------------
    def _queries(self) -> Queries:
        tables = self.global_tables.views if self.global_tables is not None else {}
        owner = self.liveness.owner if self.liveness is not None else (lambda p: None)
        standbys = None
        if self.standbys is not None:  # ?allow_standby=1: the copies, how far the owners got per their beats
            committed = self.liveness.committed if self.liveness is not None else (lambda p: None)
            standbys = StandbyReads(self.standbys.copies, committed, self.input_topic)
        address = own_address(self.settings)
        return Queries(self.app, self.settings, self.tasks, self._input_partitions, owner, tables, address, standbys)

    def _input_partitions(self) -> int:
        """The input topic's partition count, asked once (a co-partitioned App's never changes under it)."""
        if self._input_partition_count is None:
            metadata = self.admin.list_topics(self.input_topic, timeout=self.settings.request_timeout_ms / 1000)
            self._input_partition_count = len(metadata.topics[self.input_topic].partitions)
        return self._input_partition_count

    def _tell_directory(self) -> None:
        """QUERY_ENABLED with heartbeats: at most every 100 ms, the partitions owned here go into the next beats."""
        now = time.monotonic()
        if self.liveness is None or not self.settings.query_enabled or now - self._serving_told_at < 0.1:
            return
        self._serving_told_at = now
        serving = sorted((p, t) for p, t in self.tasks.items() if t.phase not in (Phase.DROPPED, Phase.CLOSED))
        offsets = tuple(-1 if t.committed_offset is None else t.committed_offset for _, t in serving)
        self.liveness.serving(own_address(self.settings), tuple(p for p, _ in serving), offsets)

    def _close_partition(self, p: int, commit: bool) -> None:
        self.restores.forget(p)
        if self._ctx is not None:
            self._ctx.registry_waits.pop(p, None)
        self._dropped_at.pop(p, None)
        self._awaiting_globals.pop(p, None)
        self._deleted_before_start.pop(p, None)
        task = self.tasks.pop(p, None)
        if task is not None:
            close_task(task, self.input, commit)
            self.metrics.forget_partition(p, self.topics)
        if len(self.topics) > 1:
            # Every topic of p, the group's too: once a revoke callback unassigns anything itself, librdkafka leaves
            # the rest to it. Unassigning only the companions left the first input's p assigned, and when the group
            # handed p back the assign failed (_CONFLICT "already part of the current assignment"): a zombie run.
            self.input.incremental_unassign(self._topic_partitions(p))
