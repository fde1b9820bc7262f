"""task(p) of the Kafka sink: processes input partition p's records into the transaction the runner gave it, and
stages p's state changes there when the runner commits. Passive: it never begins, commits or aborts a transaction on
its own (the runner does: pipeline/sinks/kafka/runner.py); what it shares with the PostgreSQL sink's task (position,
batch, retries, the phases) is pipeline/core/task.py.

    start(committed)    the group's committed offset, read after the fence, becomes the position   NEW -> RESTORING
                        (a stateless app has nothing to restore                                      -> RUNNING)
    restored(state)     pipeline/state/restore.py rebuilt p's state while p stayed paused; the input is sought back
                        to the committed offset                                    RESTORING -> REWINDING -> RUNNING
    process(records)    decode -> process -> produce the outputs into the open transaction; a record that fails is
                        retried, then dead-lettered into the same transaction or stops p (pipeline/core/processing.py;
                        docs/guarantees.md: no-silent-skip)                                         RUNNING -> STOPPED
    tick(now)           due wall-clock timers fire, a held burst of stream timers goes on (pipeline/core/timers.py)
    prepare_commit()    step 1 of the runner's commit: p's state changes and a checkpoint (the input offset they
                        cover) into p's changelog partition, in the transaction; p's next offset for step 2
    committed()         step 4: the transaction is committed, p's committed offset and state move forward
    rewind()            the transaction was aborted: state undone to the last commit, input sought back to the
                        committed offset (docs/guarantees.md: rewind-after-abort)   RUNNING -> REWINDING -> RUNNING
    drop(reason)        the producer is fenced or broken: forget everything, commit nothing          RUNNING -> DROPPED
    close()             p is no longer ours (the runner committed or aborted what was open first)            -> CLOSED
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline.app import App, Output, Record, checked_outputs
from pipeline.core.deadletter import DeadLetter, held_dead_letter
from pipeline.core.lifecycle import Phase
from pipeline.core.processing import Attempts, record_from_message, where
from pipeline.core.provenance import SOURCE_FORMAT, SOURCE_HEADER
from pipeline.core.schedule import Schedule
from pipeline.core.task import Task
from pipeline.core.timers import TimerFiring
from pipeline.kafka.clients import produce_waiting
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.retry import Backoff
from pipeline.serde import (
    RegistryPending,
    RegistryUnavailable,
    background_registry_lookups,
)
from pipeline.settings import Settings
from pipeline.sinks.kafka.hot import RUNNING, HotPath, encoder, new_record
from pipeline.sinks.kafka.hot import Encoded as Encoded  # what MultiInputTask produces
from pipeline.sinks.kafka.transaction import PRODUCER_CALL_FAILED, Transaction, TransactionAborted
from pipeline.state import PartitionState
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.state.disk_store import note_committed, ready_state
from pipeline.state.snapshot_format import Manifest
from pipeline.state.timed import TimedState, new_state, wall_clock_ms

log = logging.getLogger(__name__)
# The longest pause of a partition waiting for the schema registry: a registry back within seconds is used within
# seconds of its return.
REGISTRY_BACKOFF_MAX_S = 5.0


def registry_backoff(settings: Settings) -> Backoff:
    return Backoff(settings.processing_backoff_ms / 1000, 2.0, REGISTRY_BACKOFF_MAX_S)


# confluent-kafka's produce as the hot loop calls it, positionally; an alias: `Callable[...]` in a cast is built anew at
# every call, a batch of a partition each.
Produce = Callable[..., None]
RegistryWait = float | threading.Event  # until when (time.monotonic()), or until the look-up answers


def registry_wait_over(until: RegistryWait, now: float) -> bool:
    return until.is_set() if isinstance(until, threading.Event) else until <= now


@dataclass(frozen=True)
class KafkaTaskContext:
    """What every task of one runner shares."""

    app: App
    settings: Settings
    app_id: str
    input_topic: str
    output_topic: str
    changelog_topic: str
    dead_letter_topic: str
    consumer: Consumer
    metrics: Metrics
    wall_clock: Callable[[], int] = wall_clock_ms  # what timers and TTL call the wall clock (the test driver's own)
    global_tables: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)  # name -> what process reads
    schedule: Schedule | None = None  # the runner's loop's (None: each task has its own, outside a loop)
    # p -> when p, paused for the schema registry, is fetched again (KafkaTask._wait_for_registry): a time after a
    # fault, or the event a background look-up sets when it answers. The runner looks at this dict every turn, never
    # at every task (registry_wait_over).
    registry_waits: dict[int, RegistryWait] = field(default_factory=dict)


class KafkaTask(Task):
    def __init__(self, ctx: KafkaTaskContext, partition: int, txn: Transaction) -> None:
        s, metrics = ctx.settings, ctx.metrics
        # The module's clock, so that tests replacing `time` here record the back-off sleeps instead of sleeping.
        attempts = Attempts.of(s, metrics.processing_errors.labels(str(partition)), metrics.dead_letters, time.sleep)
        super().__init__(ctx.app, s, metrics, ctx.input_topic, partition, attempts, ctx.schedule)
        self.ctx = ctx
        self.txn = txn  # the runner's: this partition's own, or the process's (PRODUCERS=per_process)
        self.state: PartitionState = new_state(ctx.app, ctx.wall_clock)
        self.state.tables = self.table_views()
        self._staged = 0  # transactions p staged work in; the checkpoint of the n-th one is reported by delivery
        self._committed_txn = 0  # ... and the last of them that committed
        # For a snapshot on shutdown: what the state is a fold of. Set when the restore ends (restored()), then
        # moved past each committed transaction's checkpoint (its offset comes from the delivery report).
        self.snapshot_base: Manifest | None = None
        self.changelog_end: int | None = None
        self._checkpoint_at: tuple[int, int, Checkpoint] | None = None  # (transaction number, its offset, it)
        self._encode = self._encoder()  # Output -> produce arguments, built once
        self._hot = HotPath.of(ctx.app, self._encode)
        self._registry_failures = 0  # schema registry faults in a row (the back-off grows with them)
        # Timers and TTL (docs/guarantees.md: timers-exactly-once): None for an App without them, so the hot loop
        # pays one test per record.
        errors, letter = metrics.processing_errors.labels(self.label), self._timer_letter
        self._timers = (
            TimerFiring.of(
                ctx.app, s, partition, self._encode, self._produce, self._pause_input, errors, letter, self.timer_storm
            )
            if ctx.app.timed
            else None
        )

    @property
    def producer(self) -> Producer:
        """The transaction's producer, asked each time: it is replaced after an abort (`Transaction.renew`)."""
        return self.txn.producer

    # -- 1. position and restore ---------------------------------------------------------------------------------------
    def start(self, committed_offset: int | None, restore: bool | None = None) -> None:
        super().start(committed_offset, self.app.stateful if restore is None else restore)

    def start_all(self, committed: Mapping[str, int | None], restore: bool) -> None:
        """The group's committed offset of each topic p reads (a one-input App: its input) becomes its position."""
        self.start(committed[self.input_topic], restore)

    def restored(self, state: PartitionState, snapshot_base: Manifest | None = None, end: int | None = None) -> None:
        """p's state is complete (docs/guarantees.md: complete-restore): `snapshot_base` is the full snapshot it
        started from (None: the whole changelog), `end` the changelog offset it covers up to. Timers are queued and
        older state versions migrated here (on disk: as they are read); state of a newer version refuses
        (StateVersionError)."""
        state = ready_state(self.app, state, f"p{self.partition}", self.ctx.wall_clock)
        state.tables = self.table_views()
        super().restored(state)
        self.snapshot_base, self.changelog_end = snapshot_base, end

    def table_views(self) -> dict[str, Mapping[Any, Any]]:
        """The tables `process` reads through `state.tables` (a one-input App's: the global ones)."""
        return dict(self.ctx.global_tables)

    # -- 2. process ----------------------------------------------------------------------------------------------------
    def process(self, messages: list[Consumed]) -> None:
        """Processes a batch of p's records; a registry look-up they need runs in the background meanwhile (p waits
        for its answer, paused: RegistryPending), so that the loop never waits on the registry's HTTP."""
        if self._timers is not None and self._timers.held:  # fetched while a burst of timers fires: held too
            self._timers.held.extend(messages)
            return
        if background_registry_lookups.get():  # set once for the loop's whole dispatch (KafkaRunner._dispatch)
            self._process(messages)
            return
        background = background_registry_lookups.set(True)
        try:
            self._process(messages)
        finally:
            background_registry_lookups.reset(background)

    def _process(self, messages: list[Consumed]) -> None:
        """Processes a batch of p's records into the open transaction. The hot path: one tight loop, App.decode inlined
        (a retry decodes through it) with lookups hoisted once per task (HotPath), outputs produced straight away."""
        app, state, partition, timers = self.app, self.state, self.partition, self._timers
        name, decode_key, decode_value, twin_failed, encode = self._hot
        timed = cast(TimedState, state)  # what it is whenever `timers` is not None (App.timed)
        user_process, begin_record = app.process, state.begin_record if app.stateful else None
        produce = cast(Produce, self.producer.produce)  # (topic, value, key, partition, _, _, 0, headers)
        processed = produced = 0
        position, opened, running = -1 if self.next_offset is None else self.next_offset, self.batch_open, RUNNING
        for msg in messages:
            if self._phase is not running:
                break  # the rest is fetched again after the rewind
            offset = msg.offset()
            if offset < position:  # fetched before a rewind took effect (offsets grow: such records come first)
                continue
            if not opened:
                self._begin()  # the first record since the commit: p joins the transaction
                opened = True
            if timers is not None and not timers.before_record(timed, offset, msg.timestamp()[1]):
                timers.hold(messages[messages.index(msg) :])  # more are due than fire in one turn: p waits
                break
            if begin_record is not None:
                begin_record()
            outputs: list[Encoded] | None
            try:
                key, value = msg.key(), msg.value()
                try:
                    key = key if decode_key is None else decode_key(key)
                    value = value if decode_value is None else decode_value(value)
                    fields = (key, value, name, partition, offset, msg.timestamp()[1], msg.headers() or ())
                    record = new_record(Record, fields)  # Record(*fields) without its Python __new__
                except twin_failed:  # a C twin refused: the serdes' own calls give their value or their error
                    record = record_from_message(app, msg)
                # Encoded in full before the first produce: a failure half-way must leave nothing in the transaction.
                outputs = list(map(encode, user_process(state, record)))
            except Exception as error:  # from decoding or from user code: poison until proven otherwise
                try:
                    outputs = self._retry(msg, error)
                except RegistryUnavailable as unavailable:
                    self._wait_for_registry(msg, unavailable, processed)
                    break
            if outputs:
                only_source = [source := (SOURCE_HEADER, SOURCE_FORMAT % (partition, offset))]  # produce copies it
                for topic, out_key, out_value, out_partition, headers in outputs:
                    headers = [*headers, source] if headers else only_source
                    try:  # positional: keywords cost confluent-kafka ~0.4 us a call (measured)
                        produce(topic, out_value, out_key, out_partition, None, None, 0, headers)
                    except BufferError:
                        self._produce(topic, out_key, out_value, out_partition, headers)
                    except KafkaException as e:
                        self.txn.raise_classified("produce", e)
                produced += len(outputs)
            self.next_offset = offset + 1
            self.batch_records += 1
            processed += 1
        if processed or produced:
            self.note_batch(messages, msg, processed, produced)
        # The delivery reports are served once per poll of the loop by the runner (KafkaRunner._dispatch), not per
        # partition batch: at 384 partitions a batch holds ~13 records, and its producer.poll(0) was a per-batch cost.

    def _wait_for_registry(self, msg: Consumed, error: RegistryUnavailable, processed: int) -> None:
        """The schema registry did not answer for `msg` (a schema id not cached yet): a transient fault, never the
        record's. Its state changes are undone already; p stops this batch there, seeks back to it, and stays
        paused for a back-off (doubling from PROCESSING_BACKOFF_MS up to REGISTRY_BACKOFF_MAX_S) while the loop
        goes on polling: the group membership holds, the open transaction commits what came before `msg`, and
        `msg` is tried again after the pause (the runner resumes p: `registry_waits`). Never dead-lettered for it.
        A look-up still running (RegistryPending) is no fault: p waits the same way, until it answers."""
        if isinstance(error, RegistryPending):
            log.debug("p%d: %s waits for a schema registry look-up (%s)", self.partition, where(msg), error)
            self._seek_back_and_pause(msg)
            self.ctx.registry_waits[self.partition] = error.answered
            return
        self._registry_failures = 1 if processed else self._registry_failures + 1
        delay = registry_backoff(self.settings).delay(self._registry_failures)
        self._attempts.errors.inc()
        log.warning(
            "p%d: %s waits for the schema registry (%s); tried again in %.1f s (attempt %d), p paused meanwhile",
            self.partition,
            where(msg),
            error,
            delay,
            self._registry_failures,
        )
        self._seek_back_and_pause(msg)
        self.ctx.registry_waits[self.partition] = time.monotonic() + delay

    def _seek_back_and_pause(self, msg: Consumed) -> None:
        try:
            self.ctx.consumer.seek(TopicPartition(self.input_topic, self.partition, msg.offset()))
        except KafkaException as e:  # p cannot be moved back to the record: the abort's rewind can (and retries)
            raise TransactionAborted(f"seek back to {where(msg)} to wait for the schema registry: {e}") from e
        self.seeks += 1  # a batch of p polled before the seek is not handed over (the runner compares)
        self._pause_input(True)

    @property
    def waiting_for_registry(self) -> bool:
        return self.partition in self.ctx.registry_waits

    @property
    def registry_wait(self) -> RegistryWait | None:
        return self.ctx.registry_waits.get(self.partition)

    def end_registry_wait(self) -> None:
        """The back-off after a registry fault is over (the runner calls it): p is fetched again, from the record
        that waited."""
        if self.ctx.registry_waits.pop(self.partition, None) is None:
            return
        if self._phase is Phase.RUNNING or self._phase is Phase.REWINDING:
            self._pause_input(False)

    def _encoder(self) -> Callable[[Output], Encoded]:
        """Output -> (topic, key bytes, value bytes, partition or -1, headers); an output that dead-letters a held
        record (app.dead_letter) -> the dead letter."""
        return encoder(self.app, self.ctx.output_topic, self._held_dead_letter)

    def _held_dead_letter(self, output: Output) -> Encoded:
        """The dead letter of a record `process` held earlier (app.dead_letter): its bytes as its input's serdes
        write them, the dead-letter headers naming its own coordinates."""
        letter = held_dead_letter(self.app, output)
        self.metrics.dead_letters.inc()
        return (self.ctx.dead_letter_topic, letter.key, letter.value, self.partition, letter.headers())

    def _retry(self, msg: Consumed, error: Exception) -> list[Encoded] | None:
        """After a failed first attempt: the shared retry path (pipeline/core/processing.py). Its dead letter goes
        into the open transaction, which commits it with the offset past the record; None then (no outputs)."""
        app, state, encode = self.app, self.state, self._encode

        def try_once() -> list[Encoded]:  # what process returns is checked here, off the hot path (fail-fast)
            return [encode(o) for o in checked_outputs("process", app.process(state, record_from_message(app, msg)))]

        outcome = self.retry_record(msg, error, try_once)
        if not isinstance(outcome, DeadLetter):
            return outcome
        self._letter(outcome)
        return None

    def _letter(self, letter: DeadLetter) -> None:
        """A dead letter (of a record, or of a timer) into the open transaction."""
        self._produce(self.ctx.dead_letter_topic, letter.key, letter.value, self.partition, letter.headers())

    def _timer_letter(self, letter: DeadLetter) -> None:
        self.metrics.dead_letters.inc()  # a record's is counted by Attempts
        self._letter(letter)

    def _produce(self, topic: str, key: Any, value: Any, partition: int, headers: Any, **kwargs: Any) -> None:
        """partition -1: the producer's partitioner (murmur2 of the key) decides."""
        try:
            produce_waiting(self.producer, topic, value, key, partition=partition, headers=headers, **kwargs)
        except PRODUCER_CALL_FAILED as e:  # SystemError: from a delivery callback its poll served
            self.txn.raise_client_error("produce", e)

    # -- 2b. timers (docs/guarantees.md: timers-exactly-once) ----------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        """Every loop turn (the runner calls it): a held burst of due stream timers goes on, then the records held
        behind it; or the wall-clock timers due fire, even when no record arrives. At most TIMERS_PER_TURN each."""
        timers = self._timers
        if timers is None or self._phase is not Phase.RUNNING:
            return
        if timers.held:
            self.process(timers.take_held())
            if not timers.held:
                timers.release()  # the burst is over: p is fetched again
        elif self.next_offset is not None and (timed := cast(TimedState, self.state)).due("wall", now_ms):
            if not self.batch_open:
                self._begin()
            timers.fire(timed, "wall", now_ms, self.next_offset)
            self.txn.poll()

    @property
    def holding(self) -> bool:
        """Records are held while a burst of due timers fires (the runner polls without waiting meanwhile)."""
        return self._timers is not None and bool(self._timers.held)

    def _pause_input(self, paused: bool) -> None:
        tps = [TopicPartition(self.input_topic, self.partition)]
        self.ctx.consumer.pause(tps) if paused else self.ctx.consumer.resume(tps)

    def _begin(self) -> None:
        """The first record (or timer) since the last commit: p stages its work in the runner's transaction."""
        self.txn.join(self)
        self.open_batch()

    # -- 3. the runner's commit (docs/guarantees.md: one-transaction) --------------------------------------------------
    def prepare_commit(self) -> list[TopicPartition]:
        """Step 1: p's state changes and a checkpoint into p's changelog partition; p's next offset for step 2. None
        of it when p has no position yet: its first record ever stopped p (ON_POISON=stop), so nothing of p was consumed
        and there is nothing of p to commit."""
        if self.next_offset is None:
            return []
        self._stage_changelog(Checkpoint(self.input_topic, self.partition, self.next_offset))
        self._staged += 1
        return [TopicPartition(self.input_topic, self.partition, self.next_offset)]

    def _stage_changelog(self, checkpoint: Checkpoint) -> None:
        """p's state changes, then the checkpoint, into p's changelog partition (a stateful App only)."""
        if self.app.stateful:
            topic, p = self.ctx.changelog_topic, self.partition
            for key, value in self.state.changes():
                self._produce(topic, key.encode(), value, p, [])
            self._produce(
                topic,
                CHECKPOINT_KEY,
                checkpoint.encode(),
                p,
                [CHECKPOINT_HEADER],
                on_delivery=self._checkpoint_delivered(self._staged + 1, checkpoint),
            )

    def committed(self) -> None:
        """Step 4: the transaction is committed; p's committed offset and state move forward."""
        note_committed(self.state, self._staged, self._checkpoint_at)  # STATE_STORE=disk: where its batch reaches
        self.batch_committed()
        self._committed_txn = self._staged

    def _checkpoint_delivered(self, txn: int, checkpoint: Checkpoint) -> Callable[[Any, Any], None]:
        def delivered(error: Any, message: Any) -> None:
            self.txn.deliveries.report(error, message)  # its own callback replaces the producer's
            if error is None:
                self._checkpoint_at = (txn, message.offset(), checkpoint)

        return delivered

    def committed_offsets_by_topic(self) -> dict[str, int | None] | None:
        """Every topic's committed offset, for an App with several inputs (a snapshot's manifest names them)."""
        return None

    def snapshot_coverage(self) -> tuple[Manifest | None, int] | None:
        """For a full snapshot of the committed state (SNAPSHOT_ON_SHUTDOWN, pipeline/sinks/kafka/snapshot.py): the
        snapshot it was restored from and the changelog offset it covers up to; None when there is nothing new since
        that snapshot, or when it is not known exactly which changelog offset the state covers. Call it after a
        flush (the last checkpoint's offset comes with its delivery report)."""
        if self._committed_txn:
            if self._checkpoint_at is None or self._checkpoint_at[0] != self._committed_txn:
                log.warning("p%d: no snapshot on shutdown: the last checkpoint's offset is unknown", self.partition)
                return None
            self.changelog_end = self._checkpoint_at[1] + 1
        base = self.snapshot_base
        if self.changelog_end is None or self.changelog_end <= (base.changelog_offset if base else 0):
            return None
        return base, self.changelog_end

    # -- 4. after an abort ---------------------------------------------------------------------------------------------
    def rewind(self) -> None:
        """Back to the last commit: state undone, input sought back (docs/guarantees.md: rewind-after-abort).
        RUNNING -> REWINDING, and RUNNING again once the seek is done."""
        if self._timers is not None:
            self._timers.release()  # held records are fetched again after the seek
        super().rewind()
        self.try_seek_back(self.ctx.consumer)

    # -- 5. the end ----------------------------------------------------------------------------------------------------
    def drop(self, reason: str) -> None:
        """Fenced or fatally broken: forget everything, commit nothing."""
        self._transition(Phase.DROPPED)
        self.error = reason
        self.batch_open = False
        self.txn.leave(self)

    def close(self) -> None:
        """p is no longer ours; whatever it had open was committed or aborted by the runner."""
        self.batch_open = False
        self._transition(Phase.CLOSED)
