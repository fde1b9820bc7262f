"""worker(p): the exactly-once protocol for one input partition, top to bottom.

    fence()             init_transactions() on transactional.id(p): aborts any zombie transaction, fences the zombie
                        (docs/guarantees.md: fence-first)                                                       NEW
    start(committed)    the group's committed offset, read after fencing, becomes the position      -> RESTORING
                        (a stateless app has nothing to restore                                     -> RUNNING)
    restored(state)     pipeline/state/restore.py rebuilt p's state while p stayed paused   RESTORING -> RUNNING
    process(records)    decode -> process -> produce outputs, all inside one open transaction; a record that
                        fails is retried, then dead-lettered into the same transaction or stops p
                        (pipeline/processing.py; docs/guarantees.md: no-silent-skip)          RUNNING -> STOPPED
    commit()            state changes + checkpoint to the changelog, offsets to the transaction, commit
                        (docs/guarantees.md: one-transaction)
    abort_and_rewind()  abort, undo state to the last commit, seek back to the committed offset
                        (docs/guarantees.md: rewind-after-abort)            RUNNING -> REWINDING -> RUNNING
    drop(reason)        fenced or fatal producer: forget everything, commit nothing            RUNNING -> DROPPED
    close()             commit (or abort) what is open, then flush the producer                         -> CLOSED

Kafka errors inside a transaction are classified in pipeline/transaction.py. The phases and the moves between
them are pipeline/lifecycle.py's table: a move it does not list raises IllegalTransition.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition

from pipeline.app import App, Output, Record
from pipeline.deadletter import DeadLetter
from pipeline.kafka.clients import produce_waiting
from pipeline.lifecycle import Lifecycle, Phase, commit_deadline
from pipeline.metrics import Metrics
from pipeline.processing import Attempts, record_from_message
from pipeline.provenance import SOURCE_HEADER, encode_source
from pipeline.serde import identity, skip_bytes_deserialize, skip_bytes_serialize
from pipeline.settings import Settings
from pipeline.state import PartitionState
from pipeline.state.changelog import CHECKPOINT_HEADER, CHECKPOINT_KEY, Checkpoint
from pipeline.state.snapshot_format import Manifest
from pipeline.state.snapshot_writer import write_snapshot
from pipeline.state.timers import new_state, restored_state, wall_clock_ms
from pipeline.timers import TimerFiring
from pipeline.transaction import PartitionDropped, Transaction, TransactionAborted, transactional_id

log = logging.getLogger(__name__)


__all__ = ["PartitionDropped", "PartitionTask", "TaskContext", "TransactionAborted"]


@dataclass(frozen=True)
class TaskContext:
    """What every task of one runner shares."""

    app: App
    settings: Settings
    app_id: str
    input_topic: str
    output_topic: str
    changelog_topic: str
    dead_letter_topic: str
    consumer: Consumer
    make_producer: Callable[[str | None], Producer]
    metrics: Metrics
    # Test hook: called before each commit; returning True aborts that transaction instead (injected aborts).
    abort_hook: Callable[[int], bool] | None = None
    wall_clock: Callable[[], int] = wall_clock_ms  # what timers and TTL call the wall clock (the test driver's own)
    # PRODUCERS=per_process: the process's one transaction, shared by every task (None: a producer per partition).
    shared_transaction: Callable[[], Transaction] | None = None


class PartitionTask(Lifecycle):
    def __init__(self, ctx: TaskContext, partition: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.partition = partition
        self.label = str(partition)
        s = ctx.settings
        if ctx.shared_transaction is not None:
            self.txn = ctx.shared_transaction()
        else:
            txn_id = transactional_id(ctx.app_id, ctx.input_topic, partition) if s.exactly_once else None
            self.txn = Transaction(
                ctx.make_producer(txn_id),
                s,
                txn_id or f"p{partition}",
                ctx.abort_hook,
                ctx.metrics.commit_latency.observe,
            )
        self.producer = self.txn.producer
        self.state: PartitionState = new_state(ctx.app, ctx.wall_clock)
        self.committed_offset: int | None = None  # next input offset after the last committed transaction
        self.next_offset: int | None = None  # next input offset to process
        self._in_transaction = False
        self._txn_started = 0.0
        self._txn_records = 0
        self._txn_count = 0
        self._txn_first_timestamp = self._txn_last_timestamp = 0  # of its input records (ms): end-to-end latency
        self._timeout_s = s.request_timeout_ms / 1000
        # For a snapshot on shutdown: what the state is a fold of. Set when the restore ends (restored()), then
        # moved past each committed transaction's checkpoint (its offset comes from the delivery report).
        self.snapshot_base: Manifest | None = None
        self.changelog_end: int | None = None
        self._checkpoint_at: tuple[int, int] | None = None  # (transaction number, checkpoint offset)
        # Seeks back so far. Records of p polled before one are from the old position: the runner never hands them
        # over (with PRODUCERS=per_process, another partition's abort rewinds p between the poll and p's turn).
        self.seeks = 0
        self._committed_txn = 0
        self._encode = self._encoder()  # Output -> produce arguments, built once
        self._records_in = ctx.metrics.records_in.labels(self.label)  # labels() is slow: resolve once
        self._records_out = ctx.metrics.records_out.labels(self.label)
        # The module's clock, so that tests replacing `time` here record the back-off sleeps instead of sleeping.
        self._attempts = Attempts.of(
            s, ctx.metrics.processing_errors.labels(self.label), ctx.metrics.dead_letters, sleep=time.sleep
        )
        # Timers and TTL (docs/guarantees.md: timers-exactly-once): None for an App without them, so the hot loop
        # pays one test per record.
        self._timers = (
            TimerFiring.of(
                ctx.app,
                s,
                partition,
                self._encode,
                self._produce,
                self._pause_input,
                ctx.metrics.processing_errors.labels(self.label),
            )
            if ctx.app.timed
            else None
        )

    # -- 1. fence, before anything of p is read (docs/guarantees.md: fence-first) --------------------------------------
    def fence(self) -> None:
        self.txn.fence()

    # -- 2. position ---------------------------------------------------------------------------------------------------
    def start(self, committed_offset: int | None) -> None:
        self.committed_offset = committed_offset
        self.next_offset = committed_offset
        self._transition(Phase.RESTORING if self.ctx.app.stateful else Phase.RUNNING)

    # -- 3. restored ---------------------------------------------------------------------------------------------------
    def restored(self, state: PartitionState, snapshot_base: Manifest | None, changelog_end: int | None) -> None:
        """p's state is complete (docs/guarantees.md: complete-restore): `snapshot_base` is the full snapshot it
        started from (None: the whole changelog), `changelog_end` the changelog offset it covers up to. Timers are
        queued and older state versions migrated here; state of a newer version refuses (StateVersionError)."""
        self.state = restored_state(self.ctx.app, state, f"p{self.partition}", self.ctx.wall_clock)
        self._transition(Phase.RUNNING)
        self.snapshot_base, self.changelog_end = snapshot_base, changelog_end

    # -- 4. process ----------------------------------------------------------------------------------------------------
    def process(self, messages: list[Message]) -> None:
        """Processes a batch of p's records into the open transaction. The hot path: one tight loop, lookups hoisted,
        identity serdes skipped, outputs produced straight away (BufferError takes the slow path)."""
        if self._timers is not None and self._timers.held:  # fetched while a burst of timers fires: held too
            self._timers.held.extend(messages)
            return
        app, state, partition, timers = self.ctx.app, self.state, self.partition, self._timers
        decode_key, decode_value = skip_bytes_deserialize(app.key_serde), skip_bytes_deserialize(app.value_serde)
        encode = self._encode
        user_process, stateful, produce = app.process, app.stateful, self.producer.produce
        processed = produced = 0
        for msg in messages:
            if self._phase is not Phase.RUNNING:
                break  # the rest is fetched again after the rewind
            offset = msg.offset()
            if self.next_offset is not None and offset < self.next_offset:
                continue  # fetched before a rewind took effect
            if not self._in_transaction:
                self._begin()
            if timers is not None and not timers.before_record(state, offset, msg.timestamp()[1]):
                timers.hold(messages[messages.index(msg) :])  # more are due than fire in one turn: p waits
                break
            if stateful:
                state.begin_record()
            try:
                # App.decode, inlined: calling it costs two identity deserializers per record for bytes serdes
                # (copier ~8 % slower, measured); a retry (pipeline/processing.py) decodes through App.decode.
                key = msg.key() if decode_key is None else decode_key(msg.key())
                value = msg.value() if decode_value is None else decode_value(msg.value())
                record = Record(key, value, msg.topic(), partition, offset, msg.timestamp()[1], msg.headers() or ())
                # Encoded in full before the first produce: a failure half-way must leave nothing in the transaction.
                outputs = [encode(o) for o in user_process(state, record)]
            except Exception as error:  # from decoding or from user code: poison until proven otherwise
                outputs = self._retry(msg, error)
            if outputs:
                source = (SOURCE_HEADER, encode_source(partition, offset))
                for topic, out_key, out_value, out_partition, headers in outputs:
                    headers = [*headers, source] if headers else [source]
                    try:
                        produce(topic, out_value, out_key, partition=out_partition, headers=headers)
                    except BufferError:
                        self._produce(topic, out_key, out_value, out_partition, headers)
                    except KafkaException as e:
                        self.txn.raise_classified("produce", e)
                produced += len(outputs)
            self.next_offset = offset + 1
            self._txn_records += 1
            processed += 1
        if processed:  # per batch, not per record: the end-to-end latency metric costs nothing on the hot path
            self._txn_first_timestamp = self._txn_first_timestamp or messages[0].timestamp()[1]
            self._txn_last_timestamp = msg.timestamp()[1]
        self._records_in.inc(processed)
        self._records_out.inc(produced)
        self.producer.poll(0)

    def _encoder(self) -> Callable[[Output], tuple]:
        """Output -> (topic, key bytes, value bytes, partition or -1, headers)."""
        app, output_topic = self.ctx.app, self.ctx.output_topic
        encode_key, encode_value = (
            skip_bytes_serialize(app.output_key_serde),
            skip_bytes_serialize(app.output_value_serde),
        )
        if encode_key is None and encode_value is None:
            return lambda o: (
                o.topic or output_topic,
                o.key,
                o.value,
                -1 if o.partition is None else o.partition,
                o.headers,
            )
        encode_key = encode_key or identity
        encode_value = encode_value or identity
        return lambda o: (
            o.topic or output_topic,
            encode_key(o.key),
            encode_value(o.value),
            -1 if o.partition is None else o.partition,
            o.headers,
        )

    def _retry(self, msg: Message, error: Exception) -> list[tuple] | None:
        """After a failed first attempt: the shared retry path (pipeline/processing.py). Its dead letter goes into
        the open transaction, which commits it with the offset past the record; None then (no outputs)."""
        app, state, encode = self.ctx.app, self.state, self._encode
        outcome = self._attempts.retry(
            state, msg, error, lambda: [encode(o) for o in app.process(state, record_from_message(app, msg))]
        )
        if not isinstance(outcome, DeadLetter):
            return outcome
        self._produce(self.ctx.dead_letter_topic, outcome.key, outcome.value, self.partition, outcome.headers())
        return None

    def _produce(self, topic: str, key, value, partition: int, headers: list, **kwargs) -> None:
        """partition -1: the producer's partitioner (murmur2 of the key) decides."""
        try:
            produce_waiting(self.producer, topic, value, key, partition=partition, headers=headers, **kwargs)
        except KafkaException as e:
            self.txn.raise_classified("produce", e)

    # -- 4b. timers (docs/guarantees.md: timers-exactly-once) ----------------------------------------------------------
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
        elif self.next_offset is not None and self.state.due("wall", now_ms):
            if not self._in_transaction:
                self._begin()
            timers.fire(self.state, "wall", now_ms, self.next_offset)
            self.producer.poll(0)

    @property
    def holding(self) -> bool:
        """Records are held while a burst of due timers fires (the runner polls without waiting meanwhile)."""
        return self._timers is not None and bool(self._timers.held)

    def _pause_input(self, paused: bool) -> None:
        tps = [TopicPartition(self.ctx.input_topic, self.partition)]
        self.ctx.consumer.pause(tps) if paused else self.ctx.consumer.resume(tps)

    def _begin(self) -> None:
        self.txn.join(self)
        self._in_transaction = True
        self._txn_started = time.monotonic()
        self._txn_records = 0
        self._txn_first_timestamp = self._txn_last_timestamp = 0

    # -- 5. commit (docs/guarantees.md: one-transaction) ---------------------------------------------------------------
    def commit_deadline(self) -> float | None:
        s = self.ctx.settings
        return (
            commit_deadline(self._txn_started, self._txn_records, s.commit_interval_ms, s.commit_max_records)
            if self._in_transaction
            else None
        )

    def commit(self) -> None:
        """Commits p's open transaction, with every other partition writing into it (pipeline/transaction.py)."""
        if self._in_transaction:
            self.txn.commit(self.ctx.consumer)

    def prepare_commit(self) -> TopicPartition:
        """Step 1 of the commit: p's state changes and checkpoint into the transaction; p's next offset for step 2."""
        self._write_changelog()
        self._txn_count += 1
        return TopicPartition(self.ctx.input_topic, self.partition, self.next_offset)

    def committed(self) -> None:
        """Step 4: the transaction is committed; p's committed offset and state move forward."""
        self.state.commit()
        self.committed_offset = self.next_offset
        self._committed_txn = self._txn_count
        self._in_transaction = False
        self.ctx.metrics.observe_end_to_end(self._txn_first_timestamp, self._txn_last_timestamp)
        self.ctx.metrics.transactions.labels(self.label, "committed").inc()

    def _write_changelog(self) -> None:
        if not self.ctx.app.stateful:
            return
        topic, p = self.ctx.changelog_topic, self.partition
        for key, value in self.state.changes():
            self._produce(topic, key.encode(), value, p, [])
        checkpoint = Checkpoint(self.ctx.input_topic, p, self.next_offset)
        self._produce(
            topic,
            CHECKPOINT_KEY,
            checkpoint.encode(),
            p,
            [CHECKPOINT_HEADER],
            on_delivery=self._checkpoint_delivered(self._txn_count + 1),
        )

    def _checkpoint_delivered(self, txn: int) -> Callable:
        def delivered(error, message) -> None:
            if error is None:
                self._checkpoint_at = (txn, message.offset())

        return delivered

    # -- 6. abort and rewind -------------------------------------------------------------------------------------------
    def abort_and_rewind(self) -> None:
        """Back to the last committed transaction: abort, undo state, seek the input back
        (docs/guarantees.md: rewind-after-abort). RUNNING -> REWINDING, and RUNNING again once the seek is done."""
        if self._in_transaction:
            self.txn.abort()  # every partition in the transaction rewinds, p with them
        else:
            self.rewind()

    def rewind(self) -> None:
        """State undone to the last commit, position back to the committed offset."""
        self._in_transaction = False
        if self._timers is not None:
            self._timers.release()  # held records are fetched again after the seek
        self.state.undo_transaction()
        self.next_offset = self.committed_offset
        self.ctx.metrics.transactions.labels(self.label, "aborted").inc()
        self._transition(Phase.REWINDING)
        self.try_seek_back()

    def seek_to_committed(self) -> None:
        """Puts the input position at the committed offset; until the seek succeeds p is REWINDING (retried)."""
        self._transition(Phase.REWINDING)
        self.try_seek_back()

    def try_seek_back(self) -> bool:
        offset = OFFSET_BEGINNING if self.committed_offset is None else self.committed_offset
        try:
            self.ctx.consumer.seek(TopicPartition(self.ctx.input_topic, self.partition, offset))
        except KafkaException as e:
            log.info("p%d: seek back to %s not possible yet (%s); retrying", self.partition, offset, e)
            return False
        self.seeks += 1
        self._transition(Phase.RUNNING)
        return True

    # -- 6b. snapshot on clean shutdown (optional) ---------------------------------------------------------------------
    def write_snapshot(self, snapshot_topic: str) -> Manifest | None:
        """Publishes p's committed state as a full snapshot, in its own transaction on p's producer (a fenced owner
        publishes nothing). None when there is nothing new since the snapshot p was restored from, or when it is
        not known exactly which changelog offset the state covers."""
        if (
            not (self.ctx.app.stateful and self.ctx.settings.exactly_once)
            or self.phase is not Phase.RUNNING
            or self.txn.open
            or not len(self.state)
        ):
            return None
        self.producer.flush(self._timeout_s)  # serves the last checkpoint's delivery report
        if self._committed_txn:
            if self._checkpoint_at is None or self._checkpoint_at[0] != self._committed_txn:
                log.warning("p%d: no snapshot on shutdown: the last checkpoint's offset is unknown", self.partition)
                return None
            self.changelog_end = self._checkpoint_at[1] + 1
        base = self.snapshot_base
        if self.changelog_end is None or self.changelog_end <= (base.changelog_offset if base else 0):
            return None
        self.txn.call(self.producer.begin_transaction)
        try:
            manifest = write_snapshot(
                self.producer,
                app_id=self.ctx.app_id,
                snapshot_topic=snapshot_topic,
                changelog_topic=self.ctx.changelog_topic,
                partition=self.partition,
                entries=self.state.encoded_items(),
                changelog_offset=self.changelog_end,
                input_offset=self.committed_offset,
                base=base,
                timeout_s=self._timeout_s,
            )
            self.txn.call(self.producer.commit_transaction, self._timeout_s)
        except KafkaException as e:
            log.warning("p%d: snapshot on shutdown not published: %s", self.partition, e)
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(self._timeout_s)
            return None
        self.snapshot_base = manifest
        return manifest

    # -- 7. close ------------------------------------------------------------------------------------------------------
    def close(self, commit: bool) -> None:
        """Ends p's ownership: commit (or abort) the open transaction, then flush. Never raises: whatever is left
        open is aborted by the broker (transaction timeout) or by the next owner's fence."""
        if self.phase is Phase.CLOSED:
            return
        if commit and self.phase is Phase.RUNNING:
            try:
                self.commit()
            except (TransactionAborted, PartitionDropped, KafkaException) as e:
                log.warning("p%d: could not commit on close: %s", self.partition, e)
        if self._in_transaction and self.phase is not Phase.DROPPED:
            self.txn.abort_on_close(self)  # the other partitions in it (PRODUCERS=per_process) rewind
        with contextlib.suppress(KafkaException):  # a fenced producer refuses even to flush
            self.producer.flush(self._timeout_s)
        self._in_transaction = False
        self._transition(Phase.CLOSED)

    def drop(self, reason: str) -> None:
        """Fenced or fatally broken: forget everything, commit nothing."""
        self._transition(Phase.DROPPED)
        self.error = reason
        self._in_transaction = False
        self.txn.leave(self)
