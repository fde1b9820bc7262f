"""The runner of the Kafka sink: one consumer per process, one PartitionTask per owned input partition.

Lifecycle of partition p in this process: the task's Phase (pipeline/lifecycle.py), moved by the task's methods.
    assigned  -> fence (init_transactions) -> read committed offset -> assign at that offset              NEW
    restoring -> p paused; the changelog read in short steps between polls (self.restores)     NEW -> RESTORING
    running   -> task.restored(...), p resumed (a stateless app starts here); records processed into
                 transactions, committed on interval/size                          RESTORING (or NEW) -> RUNNING
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
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from pipeline.app import App
from pipeline.deadletter import dead_letter_topic
from pipeline.kafka.acls import Names
from pipeline.kafka.clients import client_config, consumer_config, producer_config, restore_consumer_config
from pipeline.kafka.permissions import AFTER_TOPICS, BEFORE_TOPICS, check_service, missing_transactional_id
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG, ensure_topics
from pipeline.lifecycle import Phase
from pipeline.loop import BUSY_WAIT_S, IDLE_WAIT_S, REFENCE_AFTER_S, FatalRunnerError, PollLoop
from pipeline.processing import PoisonRecordStop
from pipeline.settings import PER_PROCESS, Settings
from pipeline.state.changelog import changelog_topic
from pipeline.state.restore import ChangelogRestore
from pipeline.state.restore_manager import RestoreManager
from pipeline.state.snapshot_format import snapshot_topic
from pipeline.task import PartitionDropped, PartitionTask, TaskContext, TransactionAborted
from pipeline.transaction import Transaction

log = logging.getLogger(__name__)


class Runner(PollLoop):
    def __init__(self, app: App, settings: Settings, abort_hook: Callable[[int], bool] | None = None) -> None:
        super().__init__(settings)
        self.app = app
        self.app_id = settings.app_id or app.name
        self.input_topic = settings.input_topic or app.input_topic
        self.output_topic = settings.output_topic or app.output_topic
        self.changelog_topic = settings.changelog_topic or changelog_topic(self.app_id)
        self.snapshot_topic = settings.snapshot_topic or snapshot_topic(self.app_id)
        self.dead_letter_topic = settings.dead_letter_topic or dead_letter_topic(self.app_id)
        self.tasks: dict[int, PartitionTask] = {}
        self._dropped_at: dict[int, float] = {}
        if abort_hook is None and settings.test_abort_every > 0:
            every = settings.test_abort_every
            abort_hook = lambda n: n % every == 0  # noqa: E731
        self._abort_hook = abort_hook
        self._timeout_s = settings.request_timeout_ms / 1000
        self.admin = AdminClient(client_config(settings))
        self.restores = RestoreManager(
            settings,
            self.changelog_topic,
            self.snapshot_topic,
            app.state_serde,
            self._make_restore_consumer,
            lambda: AdminClient(client_config(settings)),
            self.admin,
        )
        self.ctx: TaskContext | None = None
        self._process_txn: Transaction | None = None  # PRODUCERS=per_process: the one producer's transaction
        self._process_txn_id = process_transactional_id(self.app_id, self.input_topic, settings.group_instance_id)
        self._commit_pool = ThreadPoolExecutor(4, thread_name_prefix="commit")

    # -- clients -----------------------------------------------------------------------------------------------------
    def _make_producer(self, txn_id: str | None) -> Producer:
        return Producer(producer_config(self.settings, txn_id))

    def _make_restore_consumer(self) -> Consumer:
        return Consumer(restore_consumer_config(self.settings, f"{self.app_id}.restore"))

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Checks the topics and creates the consumer; `run()` calls it."""
        if self.consumer is not None:
            return
        s = self.settings
        internal = {self.dead_letter_topic: {}}
        if self.app.stateful:
            internal[self.changelog_topic] = CHANGELOG_CONFIG
            internal[self.snapshot_topic] = SNAPSHOT_CONFIG
        names = Names(
            self.app_id,
            self.input_topic,
            self.output_topic,
            self.changelog_topic,
            self.snapshot_topic,
            self.dead_letter_topic,
        )
        check_service(self.admin, names, s, stateful=self.app.stateful, phase=BEFORE_TOPICS)
        ensure_topics(
            self.admin,
            input_topic=self.input_topic,
            output_topic=self.output_topic,
            internal=internal,
            replication_factor=s.topic_replication_factor,
            timeout_s=self._timeout_s,
        )
        check_service(self.admin, names, s, stateful=self.app.stateful, phase=AFTER_TOPICS)
        self.consumer = Consumer(consumer_config(s, self.app_id))
        per_process = s.producers == PER_PROCESS
        self.ctx = TaskContext(
            self.app,
            s,
            self.app_id,
            self.input_topic,
            self.output_topic,
            self.changelog_topic,
            self.dead_letter_topic,
            self.consumer,
            self._make_producer,
            self.metrics,
            self._abort_hook,
            shared_transaction=self._process_transaction if per_process else None,
        )
        if per_process:  # fenced once, at start, before any partition is assigned (docs/guarantees.md: fence-first)
            self._fence_transactions([self._process_transaction()])

    def _process_transaction(self) -> Transaction:
        """PRODUCERS=per_process: the process's producer, replaced (same transactional.id) once it is broken."""
        if self._process_txn is None or self._process_txn.broken:
            txn_id = self._process_txn_id if self.settings.exactly_once else None
            self._process_txn = Transaction(
                self._make_producer(txn_id),
                self.settings,
                self._process_txn_id,
                self._abort_hook,
                self.metrics.commit_latency.observe,
            )
        return self._process_txn

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
                self._snapshot(self.tasks[p])
            self._close_partition(p, commit=True)
        if self.consumer is not None:
            # Leaves the group (a static member does not: its partitions wait for it until the session times out).
            self.consumer.close()
        self._commit_pool.shutdown()
        log.info("%s: stopped", self.app_id)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _loop_once(self) -> None:
        rewinding = any(t.phase is Phase.REWINDING or t.holding for t in self.tasks.values())
        busy = self.restores.busy or rewinding
        messages = self._poll(BUSY_WAIT_S if busy else IDLE_WAIT_S)
        self._dispatch(messages)
        self._tick_timers()
        self._commit_due()
        self._advance_restores()
        self._retry_rewinds_and_drops()
        self._update_gauges()

    def _dispatch(self, messages: list[Message]) -> None:
        batches = self._by_partition(messages)
        polled_at = {p: task.seeks for p in batches if (task := self.tasks.get(p)) is not None}
        for p, batch in batches.items():
            task = self.tasks.get(p)
            # Not after a seek back since the poll (docs/guarantees.md: rewind-after-abort): with one transaction
            # for the process, an abort while an earlier partition's batch ran rewinds this one too, and its batch
            # continues from the old position: handing it over would skip the records in between.
            if task is not None and task.phase is Phase.RUNNING and task.seeks == polled_at[p]:
                self._guarded(task, task.process, batch)

    def _tick_timers(self) -> None:
        """Wall-clock timers fire even when no record arrives, and a burst of due stream timers goes on, both bounded
        per turn (docs/guarantees.md: timers-exactly-once)."""
        if not self.app.timed:
            return
        now_ms = self.ctx.wall_clock()
        for task in list(self.tasks.values()):
            if task.phase is Phase.RUNNING:
                self._guarded(task, task.tick, now_ms)

    def _commit_due(self) -> None:
        """One commit per transaction due: per partition, or one for the whole process (PRODUCERS=per_process)."""
        due = list(
            {id(task.txn): task for p in self._to_commit(time.monotonic()) if (task := self.tasks[p]).txn.open}.values()
        )
        if len(due) == 1:
            self._guarded(due[0], due[0].commit)
        elif due:  # a producer per partition: commits wait on the network and release the GIL
            list(self._commit_pool.map(lambda t: self._guarded(t, t.commit), due))

    def _guarded(self, task: PartitionTask, step: Callable, *args) -> None:
        """Runs one step of a task and turns its failures into the task's transitions (docs/guarantees.md:
        rewind-after-abort, unknown-commit-retried, no-silent-skip)."""
        try:
            step(*args)
        except TransactionAborted as e:
            log.warning(
                "p%d: transaction aborted (%s); rewinding to offset %s", task.partition, e, task.committed_offset
            )
            try:
                task.abort_and_rewind()
            except (TransactionAborted, PartitionDropped) as again:
                self._drop(task, str(again))
        except PartitionDropped as e:
            self._drop(task, str(e))
        except PoisonRecordStop as e:
            self._guarded(task, task.commit)  # what came before the poison record is good: keep it
            if task.phase is not Phase.DROPPED:  # dropped by that commit: taken over again, and stopped then
                self._stop_partition(task, e)

    def _drop(self, task: PartitionTask, reason: str) -> None:
        """Drops the task, and every task whose work went through the same broken producer (PRODUCERS=per_process:
        all the running ones); each is taken over again after REFENCE_AFTER_S, with a new producer."""
        sharing = [
            t
            for t in self.tasks.values()
            if t is not task and t.txn is task.txn and t.txn.broken and t.phase in (Phase.RUNNING, Phase.REWINDING)
        ]
        for victim in [task, *sharing]:
            log.warning("p%d: dropped without committing: %s", victim.partition, reason)
            victim.drop(reason)
            self.metrics.fenced.inc()
            self._pause(victim.partition)
            self._dropped_at[victim.partition] = time.monotonic()

    def _retry_rewinds_and_drops(self) -> None:
        for task in list(self.tasks.values()):
            if task.phase is Phase.REWINDING:
                task.try_seek_back()
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

    # -- assignment --------------------------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._take_over([tp.partition for tp in partitions], reassign=False)

    def _take_over(self, partitions: list[int], reassign: bool) -> None:
        if self._process_txn is not None and self._process_txn.open:
            # The committed offsets below may wait for a previous owner's transaction (PRODUCERS=per_process), up to
            # TRANSACTION_TIMEOUT_MS: long enough for the broker to abort ours, open meanwhile. Commit it first.
            first = self._process_txn.participants[0]
            self._guarded(first, first.commit)
        tasks = [PartitionTask(self.ctx, p) for p in partitions]
        self._fence_all(tasks)  # before any of p's offsets or state are read (docs/guarantees.md: fence-first)
        committed = self._committed_offsets(partitions)
        if reassign:  # still assigned (and paused) since the drop: only the position moves
            for p in partitions:
                offset = OFFSET_BEGINNING if committed[p] is None else committed[p]
                self.consumer.seek(TopicPartition(self.input_topic, p, offset))
        else:
            self.consumer.incremental_assign(
                [
                    TopicPartition(self.input_topic, p, OFFSET_INVALID if committed[p] is None else committed[p])
                    for p in partitions
                ]
            )
        self._resume_assigned(partitions)
        for task in tasks:
            self.tasks[task.partition] = task
            task.start(committed[task.partition])
            if task.phase is Phase.RESTORING:
                self._pause(task.partition)
                self.restores.start(task.partition, task.committed_offset)
        self.metrics.assigned.set(len(self.tasks))
        log.info("assigned %s (committed offsets %s)", partitions, committed)

    def _fence_all(self, tasks: list[PartitionTask]) -> None:
        self._fence_transactions(list({id(t.txn): t.txn for t in tasks}.values()))

    def _fence_transactions(self, txns: list[Transaction]) -> None:
        if not txns:
            return
        with ThreadPoolExecutor(len(txns)) as pool:
            results = list(pool.map(_fence_with_retries, txns, [self.settings] * len(txns)))
        failed = [f"{t.name}: {r}" for t, r in zip(txns, results, strict=True) if r]
        if failed:
            raise FatalRunnerError("cannot fence " + "; ".join(failed) + " (is the transaction coordinator up?)")

    def _committed_offsets(self, partitions: list[int]) -> dict[int, int | None]:
        """The group's committed offsets, retried while the coordinator moves (bounded: 3 request time-outs). They are
        read stable (read_committed makes librdkafka ask with require_stable): while a previous owner's transaction
        holding offsets of p is open, the broker answers UNSTABLE_OFFSET_COMMIT and librdkafka asks again, so the
        wait lasts until that transaction ends, at most TRANSACTION_TIMEOUT_MS (docs/guarantees.md: zombies-stay-out).
        """
        tps = [TopicPartition(self.input_topic, p) for p in partitions]
        deadline = time.monotonic() + max(
            3 * self._timeout_s, self.settings.transaction_timeout_ms / 1000 + self._timeout_s
        )
        while True:
            try:
                result = self.consumer.committed(tps, timeout=self._timeout_s)
                return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}
            except KafkaException as e:
                if time.monotonic() > deadline or e.args[0].fatal():
                    raise FatalRunnerError(f"committed offsets of {partitions} not readable: {e.args[0]}") from e
                log.warning("committed offsets of %s: %s; retrying", partitions, e.args[0])
                time.sleep(0.5)

    def _advance_restores(self) -> None:
        for restore in self.restores.step():
            self._restored(restore)

    def _restored(self, restore: ChangelogRestore) -> None:
        p = restore.partition
        task = self.tasks[p]
        task.restored(restore.state, restore.snapshot, restore.end)
        # The position comes from the committed offset, never from the fetcher (docs/guarantees.md:
        # rewind-after-abort): a record of p returned while p restored was dropped by _dispatch, and resuming from
        # the fetched position would skip it (an image fault run once lost p0's first 635 records that way, or so
        # it looked; one seek per restore rules it out).
        task.seek_to_committed()
        self.consumer.resume([TopicPartition(self.input_topic, p)])
        self.metrics.restore_seconds.labels(str(p)).set(restore.seconds)
        self.metrics.restore_records.labels(str(p)).inc(restore.records)
        self.metrics.restore_snapshot_entries.labels(str(p)).inc(restore.snapshot_entries)
        log.info(
            "p%d restored: %d keys from %d snapshot entries (%s) and %d changelog records in %.2fs",
            p,
            len(restore.state),
            restore.snapshot_entries,
            restore.snapshot.snapshot_id if restore.snapshot else "no snapshot",
            restore.records,
            restore.seconds,
        )

    def _snapshot(self, task: PartitionTask) -> None:
        """Commits what is open, then publishes the state as a full snapshot (SNAPSHOT_ON_SHUTDOWN)."""
        self._guarded(task, task.commit)
        started = time.monotonic()
        manifest = task.write_snapshot(self.snapshot_topic)
        if manifest is not None:
            log.info(
                "p%d: snapshot %s published on shutdown: %d entries in %d chunks, covers changelog < %d and "
                "input < %s (%.2fs)",
                task.partition,
                manifest.snapshot_id,
                manifest.entries,
                manifest.chunks,
                manifest.changelog_offset,
                manifest.input_offset,
                time.monotonic() - started,
            )

    # -- revocation --------------------------------------------------------------------------------------------------
    def _owned_partitions(self) -> dict[int, PartitionTask]:
        return self.tasks

    def _close_partition(self, p: int, commit: bool) -> None:
        self.restores.forget(p)
        self._dropped_at.pop(p, None)
        task = self.tasks.pop(p, None)
        if task is not None:
            task.close(commit=commit)
            self.metrics.forget_partition(p)


def process_transactional_id(app_id: str, topic: str, group_instance_id: str) -> str:
    """PRODUCERS=per_process: named after the static member when there is one, so that its next start aborts what its
    last left open at once; otherwise unique per start (two processes must never share it), and what a crashed
    process left open holds its partitions' next owners up to TRANSACTION_TIMEOUT_MS. Under the service's
    transactional-id prefix, like the per-partition names (pipeline/kafka/acls.py)."""
    return f"{app_id}.{topic}.process-{group_instance_id or uuid.uuid4().hex[:12]}"


def _fence_with_retries(txn: Transaction, settings: Settings) -> str | None:
    """init_transactions with bounded retries; returns the last error, or None once fenced."""
    deadline = time.monotonic() + 3 * settings.request_timeout_ms / 1000
    while True:
        try:
            txn.fence()
            return None
        except KafkaException as e:
            if (missing := missing_transactional_id(e.args[0], txn.name)) is not None:
                raise missing from e
            if time.monotonic() > deadline or e.args[0].fatal():
                return str(e.args[0])
            log.warning("%s: init_transactions: %s; retrying", txn.name, e.args[0])
            time.sleep(0.5)
