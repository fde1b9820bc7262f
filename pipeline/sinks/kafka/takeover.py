"""The blocking steps of taking partitions over in the Kafka sink, each bounded and retried while the cluster moves:
the topics checked (and the internal ones created) at start-up, the fence, the group's committed offsets. The
runner (pipeline/sinks/kafka/runner.py: `KafkaRunner._take_over`) calls them in this order: fence, then offsets,
then assign, then restore (docs/guarantees.md: fence-first)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.app import App
from pipeline.core.lifecycle import Lifecycle, Phase
from pipeline.core.loop import FatalRunnerError
from pipeline.kafka.acls import Names
from pipeline.kafka.clients import client_config, restore_consumer_config
from pipeline.kafka.errors import kafka_error
from pipeline.kafka.kafka_python import GroupAdmin, GroupAnswer
from pipeline.kafka.liveness import LIVENESS_TOPIC_CONFIG, Liveness, liveness_topic
from pipeline.kafka.permissions import AFTER_TOPICS, BEFORE_TOPICS, check_service, missing_transactional_id
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG, ensure_topics
from pipeline.metrics import Metrics
from pipeline.retry import Backoff, retry
from pipeline.settings import PER_PROCESS, ConfigError, Settings
from pipeline.sinks.kafka.inputs import MultiInputTask
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import Transaction
from pipeline.state.global_tables import GlobalTables, PendingTargets
from pipeline.state.restore import ChangelogRestore
from pipeline.state.restore_manager import RestoreManager
from pipeline.state.standby import Standbys

log = logging.getLogger(__name__)
# While the transaction or group coordinator moves (a broker restarting): asked again this often.
COORDINATOR_BACKOFF = Backoff(0.5, factor=1)
# The most transactional ids fenced at once that get the quick fence (pipeline/kafka/kafka_python.py) first. Each is
# a kafka-python client of its own, in Python: a take-over of a few partitions (a crashed peer's) gains ~0.45 s per
# open transaction, but 384 at once (PRODUCERS=per_partition joining a group) would cost more CPU than it saves.
QUICK_FENCE_AT_MOST = 8


def prepare_topics(admin: AdminClient, names: Names, settings: Settings, stateful: bool) -> None:
    """The service's permissions, its input and output topics, and its internal topics (created when missing):
    a clear error naming what is wrong before anything is consumed."""
    internal: dict[str, dict[str, str]] = {names.dead_letter_topic: {}}
    if stateful:
        internal[names.changelog_topic] = CHANGELOG_CONFIG
        internal[names.snapshot_topic] = SNAPSHOT_CONFIG
    check_service(admin, names, settings, stateful=stateful, phase=BEFORE_TOPICS)
    # created here, not by the heartbeat thread: the check after it then covers READ and WRITE on it too
    detection = {names.liveness: LIVENESS_TOPIC_CONFIG} if settings.failure_detection_ms > 0 else {}
    ensure_topics(
        admin,
        input_topic=names.input_topic,
        output_topic=names.output_topic,
        co_partitioned=names.co_partitioned,
        global_tables=names.global_tables,
        internal=internal,
        single=detection,
        replication_factor=settings.topic_replication_factor,
        timeout_s=settings.request_timeout_ms / 1000,
    )
    check_service(admin, names, settings, stateful=stateful, phase=AFTER_TOPICS)


def start_liveness(settings: Settings, app_id: str, process_txn_id: str) -> Liveness | None:
    """FAILURE_DETECTION_MS > 0: the heartbeat thread that finds silent peers, fences their per-process producer and
    removes them from the group (pipeline/kafka/liveness.py); it names this process's producer under per_process,
    so that its peers can do the same for it."""
    if settings.failure_detection_ms <= 0:
        return None
    per_process = settings.producers == PER_PROCESS and settings.exactly_once
    return Liveness(
        settings,
        client_config(settings),
        app_id,
        liveness_topic(app_id),
        transactional_id=process_txn_id if per_process else "",
    ).start()


def fence(txns: list[Transaction], settings: Settings) -> None:
    """init_transactions on every transaction's producer, in parallel, each retried for 3 request time-outs;
    FatalRunnerError naming the ones that could not be fenced. A missing transactional-id permission is named at
    once (MissingPermission)."""
    if not txns:
        return
    quick = len(txns) <= QUICK_FENCE_AT_MOST
    with ThreadPoolExecutor(len(txns)) as pool:
        results = list(pool.map(lambda txn: _fence_one(txn, settings, quick), txns))
    failed = [f"{t.name}: {r}" for t, r in zip(txns, results, strict=True) if r]
    if failed:
        raise FatalRunnerError("cannot fence " + "; ".join(failed) + " (is the transaction coordinator up?)")


def _fence_one(txn: Transaction, settings: Settings, quick: bool) -> str | None:
    """The last error, or None once fenced."""

    def failed(error: Exception, failures: int, delay: float | None) -> None:
        if (known := kafka_error(error)) is not None and (missing := missing_transactional_id(known, txn.name)):
            raise missing from error
        if delay is not None:
            log.warning("%s: init_transactions: %s; retrying", txn.name, known)

    try:
        retry(
            lambda: txn.fence(quick),
            retriable=_not_fatal,
            backoff=COORDINATOR_BACKOFF,
            within_s=3 * settings.request_timeout_ms / 1000,
            on_failure=failed,
        )
    except KafkaException as e:
        return str(e.args[0])
    return None


def committed_offsets(
    consumer: Consumer, topics: Sequence[str], partitions: list[int], settings: Settings
) -> dict[int, dict[str, int | None]]:
    """p -> topic -> the group's committed offset of partition p of each topic (None: nothing committed), retried
    while the coordinator moves (bounded: 3 request time-outs). They are read stable (read_committed makes librdkafka
    ask with require_stable): while a previous owner's transaction holding offsets of p is open, the broker answers
    UNSTABLE_OFFSET_COMMIT and librdkafka asks again, so the wait lasts until that transaction ends, at most
    TRANSACTION_TIMEOUT_MS (docs/guarantees.md: zombies-stay-out)."""
    tps = [TopicPartition(t, p) for p in partitions for t in topics]
    timeout_s = settings.request_timeout_ms / 1000

    def failed(error: Exception, failures: int, delay: float | None) -> None:
        if delay is not None:
            log.warning("committed offsets of %s: %s; retrying", partitions, kafka_error(error))

    try:
        result = retry(
            lambda: consumer.committed(tps, timeout=timeout_s),
            retriable=_not_fatal,
            backoff=COORDINATOR_BACKOFF,
            within_s=max(3 * timeout_s, settings.transaction_timeout_ms / 1000 + timeout_s),
            on_failure=failed,
        )
    except KafkaException as e:
        raise FatalRunnerError(f"committed offsets of {partitions} not readable: {e.args[0]}") from e
    offsets: dict[int, dict[str, int | None]] = {p: {} for p in partitions}
    for tp in result:
        offsets[tp.partition][tp.topic] = tp.offset if tp.offset >= 0 else None
    return {p: {t: offsets[p].get(t) for t in topics} for p in partitions}


def _not_fatal(error: Exception) -> bool:
    known = kafka_error(error)
    return isinstance(error, KafkaException) and not (known is not None and known.fatal())


class TakeOver:
    """How the Kafka runner (pipeline/sinks/kafka/runner.py) takes partitions over and gives them up: fence, committed
    offsets, position, restore (state, co-partitioned tables, global tables read far enough), then running; and the
    close when a partition goes. A mixin of KafkaRunner, apart so that the runner's file holds the loop and the
    transaction protocol."""

    app: App
    settings: Settings
    metrics: Metrics
    app_id: str
    input_topic: str
    changelog_topic: str
    topics: tuple[str, ...]
    tasks: dict[int, KafkaTask]
    restores: RestoreManager
    admin: AdminClient
    global_tables: GlobalTables | None
    _awaiting_globals: dict[int, tuple[PendingTargets, ChangelogRestore | None]]
    _deleted_before_start: dict[int, tuple[str, str]]  # p -> (topic, detail): input deleted below its position
    _dropped_at: dict[int, float]
    _process_txn: Transaction | None
    standbys: Standbys | None = None  # STANDBY_REPLICAS: open() makes them
    _member_id = ""  # the group's, after every (re)join
    liveness: Liveness | None

    if TYPE_CHECKING:  # the runner's, used here

        @property
        def input(self) -> Consumer: ...

        def _commit(self, txn: Transaction) -> None: ...

        def _input_records_deleted(self, topic: str, p: int, detail: str) -> None: ...

        def _new_task(self, p: int) -> KafkaTask: ...

        def _pause(self, p: int) -> None: ...

        def _resume(self, p: int) -> None: ...

        def _resume_assigned(self, partitions: list[int]) -> None: ...

    def _after_lost(self) -> None:
        """Membership expired: a pause past the session time-out, or a peer's failure detector removed this process,
        and fenced its per-process producer beside the removal. Nothing may have failed on that producer yet, and
        fence() takes an initialised producer for fenced already, so the next take-over would run on a stale epoch.
        It goes to a new producer, initialised before the restore (docs/guarantees.md: fence-first). A soak found
        the old one kept: a paused process rejoined, restored, and its first transaction failed fatally."""
        if self._process_txn is not None:
            self._process_txn.broken = True

    def _joined(self, member_id: str) -> None:
        """After every (re)join, on the consumer's thread: the heartbeat and the standby placement name this member."""
        self._member_id = member_id
        if self.liveness is not None:
            self.liveness.joined(member_id)

    def _global_tables(self) -> GlobalTables:
        s = self.settings
        make_consumer = lambda: Consumer(restore_consumer_config(s, f"{self.app_id}.global"))  # noqa: E731
        timeouts = (s.request_timeout_ms / 1000, s.restore_timeout_ms / 1000)
        return GlobalTables(self.app.global_table_specs, make_consumer, self.admin, self.metrics, *timeouts)

    def _standbys(self) -> Standbys | None:
        """STANDBY_REPLICAS > 0: the standby copies this process keeps of others' partitions (state/standby.py)."""
        s = self.settings
        if s.standby_replicas <= 0:
            return None
        if not self.app.stateful:
            log.warning("STANDBY_REPLICAS=%d is ignored: %s keeps no state", s.standby_replicas, self.app.name)
            return None
        # Followed partitions sit at their changelog's end: a fetch waits up to 200 ms there, not the restore's 10.
        config = {**restore_consumer_config(s, f"{self.app_id}.standby"), "fetch.wait.max.ms": 200}
        describe = self._group_describer()
        if describe is None:
            return None
        return Standbys(
            s.standby_replicas,
            self.changelog_topic,
            self.restores.warm_up,
            lambda: Consumer(config),
            describe,
            lambda: self._member_id,
            self.metrics.standby_copies.set,
        )

    def _group_describer(self) -> Callable[[], GroupAnswer] | None:
        """How the standby placement reads the group's assignment, on its own thread: through kafka-python
        (GroupAdmin; under GROUP_PROTOCOL=consumer its KIP-848 ConsumerGroupDescribe), never librdkafka's admin
        client, which 2.16 aborted the process with while the coordinator's broker died. None, said, when
        kafka-python cannot take a security property."""
        s = self.settings
        try:
            return partial(GroupAdmin(s, self.app_id).describe, self.input_topic)
        except ConfigError as e:
            log.warning(
                "STANDBY_REPLICAS=%d is ignored: the group's assignment cannot be read (%s)", s.standby_replicas, e
            )
            return None

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._take_over([tp.partition for tp in partitions], reassign=False)

    def _take_over(self, partitions: list[int], reassign: bool) -> None:
        """Fence, then the committed offsets, then the position, then the restore (docs/guarantees.md: fence-first);
        `reassign`: p is still assigned (and paused) since it was dropped, so only its position moves. Every topic of
        p goes along: the group assigns the first input's partitions, the runner the other topics' (docs/inputs.md)."""
        if self._process_txn is not None and self._process_txn.open:
            # The committed offsets below may wait for a previous owner's transaction (PRODUCERS=per_process), up to
            # TRANSACTION_TIMEOUT_MS: long enough for the broker to abort ours, open meanwhile. Commit it first.
            self._commit(self._process_txn)
        tasks = [self._new_task(p) for p in partitions]
        self._fence(tasks)
        committed = self._committed_offsets(partitions)
        positions = [(t, p, o) for p in partitions for t, o in committed[p].items()]
        if reassign:
            for t, p, o in positions:
                self.input.seek(TopicPartition(t, p, OFFSET_BEGINNING if o is None else o))
        else:
            self.input.incremental_assign(
                [TopicPartition(t, p, OFFSET_BEGINNING if o is None else o) for t, p, o in positions]
            )
        self._resume_assigned(partitions)
        targets = self.global_tables.ask_targets() if self.global_tables is not None else None
        for task in tasks:
            self._start(task, committed[task.partition], targets)
        self.metrics.assigned.set(len(self.tasks))
        log.info("assigned %s (committed offsets %s)", partitions, committed)

    def _start(self, task: KafkaTask, committed: dict[str, int | None], targets: PendingTargets | None) -> None:
        """p's committed offsets become its position; its state is restored, and its global tables read up to
        `targets`, before it processes anything (p stays paused meanwhile)."""
        p = task.partition
        self.tasks[p] = task
        task.start_all(committed, restore=self.app.stateful or targets is not None)
        if task.phase is not Phase.RESTORING:
            return
        self._pause(p)
        if self.app.stateful:
            copy = self.standbys.take(p) if self.standbys is not None else None
            self.restores.start(p, committed if self.app.multi_input else committed[self.input_topic], copy)
        if targets is not None:
            self._awaiting_globals[p] = (targets, None)

    def _fence(self, tasks: list[KafkaTask]) -> None:
        """Before any of their offsets or state are read (docs/guarantees.md: fence-first)."""
        fence(list({id(t.txn): t.txn for t in tasks}.values()), self.settings)

    def _committed_offsets(self, partitions: list[int]) -> dict[int, dict[str, int | None]]:
        """p -> topic -> the group's committed offset of every topic task p reads."""
        return committed_offsets(self.input, self.topics, partitions, self.settings)

    def _restoring(self) -> bool:
        """A restore, a standby's warm-up or a wait for the global tables is under way: the loop turns fast."""
        warming = self.standbys is not None and self.standbys.busy
        return self.restores.busy or warming or bool(self._awaiting_globals)

    def _advance_restores(self) -> None:
        if self.standbys is not None:  # after the restores of owned partitions, with a quarter of their budget
            self.standbys.step(self.tasks.keys(), self.settings.restore_step_ms / 4000)
        for finished in self.restores.step():
            if finished.partition in self._awaiting_globals:
                targets, _ = self._awaiting_globals[finished.partition]
                self._awaiting_globals[finished.partition] = (targets, finished)
            else:
                self._restored(self.tasks[finished.partition], finished)
        for p, (targets, restore) in list(self._awaiting_globals.items()):
            if (restore is not None or not self.app.stateful) and self._globals_reached(targets):
                del self._awaiting_globals[p]
                self._restored(self.tasks[p], restore)

    def _globals_reached(self, pending: PendingTargets) -> bool:
        if self.global_tables is None:
            return True
        targets = pending.result()
        return targets is not None and self.global_tables.reached(targets)

    def _restored(self, task: KafkaTask, restore: ChangelogRestore | None) -> None:
        """p's state and tables are complete: p is sought to its committed offsets and resumed."""
        p = task.partition
        if restore is None:  # stateless: it only waited for the global tables
            task.restored(task.state)
        else:
            task.restored(restore.state, restore.snapshot, restore.end)
            if restore.tables is not None and isinstance(task, MultiInputTask):
                task.tables_restored(restore.tables.stores, restore.tables.positions)
            self.metrics.observe_restore(p, restore.seconds, restore.records, restore.snapshot_entries)
            log.info("%s", restore.summary())
        if (deleted := self._deleted_before_start.pop(p, None)) is not None:  # reported while p restored
            self._input_records_deleted(deleted[0], p, deleted[1])  # p stops (paused), its position unusable
            return
        task.try_seek_back(self.input)  # the position comes from the committed offset, never from the fetcher
        self._resume(p)

    def _owned_partitions(self) -> dict[int, KafkaTask]:
        return self.tasks

    # -- for the stall watchdog (pipeline/core/stall.py) ---------------------------------------------------------------
    def _admin_client(self) -> AdminClient | None:
        return self.admin

    def _restore_progress(self, p: int) -> object:
        return self.restores.progress(p), p in self._awaiting_globals

    def _stall_detail(self, p: int) -> list[str]:
        task = self.tasks.get(p)
        detail = []
        if task is not None and task.phase is Phase.RESTORING:
            detail.append(self.restores.stuck(p) if self.app.stateful else "restored")
            if p in self._awaiting_globals:
                detail.append("waiting for the global tables to reach their targets")
        if task is not None and task.holding:
            detail.append("holding records while a burst of due timers fires")
        if p in self._dropped_at:
            detail.append("dropped (fenced or broken producer), to be taken over again")
        return detail

    def _positions(self, owned: Lifecycle) -> dict[str, int | None]:
        if isinstance(owned, MultiInputTask):
            return dict(owned.next_offsets)
        return {self.input_topic: owned.next_offset}

    def _topic_partitions(self, p: int) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in self.topics]
