"""task(p) of an App with several co-partitioned inputs or tables (docs/inputs.md): partition p of every input
stream and every co-partitioned table, one state, one transaction, taken in timestamp order.

    buffers     records of each topic wait in their own queue, in offset order, until they can be taken in order
    taking      the record with the smallest timestamp first (ties: tables before streams, then in the App's order),
                as Kafka Streams does: the queue with the smallest head goes first. An empty queue holds everything
                back while its topic has records on the broker this task has not fetched, at most MAX_TASK_IDLE_MS
                (-1: never); an empty queue of a topic that is caught up holds nothing back
    a table     a record of a co-partitioned table updates the table (`state.tables[name]`) instead of going to
                `process`; the update is undone with the transaction if it aborts
    commit      the checkpoint names every topic's next offset and the order the transaction took their records in
                (pipeline/state/changelog.py), so that the checker can replay exactly this interleaving
    rewind      state and tables undone, the queues emptied, every topic sought back to its committed offset

    timers      stream time is the largest timestamp among the records p has taken from any of its topics (tables
                included); before each record, stream timers due at its timestamp or earlier fire. A firing is
                named by its position in p's merge: how many records p had taken before it (`taken`, kept in the
                state as of each commit), the same for wall-clock timers, which fire on the loop's turn. A replay takes
                the checkpoints' order, so it fires the same timers at the same positions (pipeline/testing/oracle/)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline.app import Record
from pipeline.core.lifecycle import Phase
from pipeline.core.merge import OrderRuns, WaitsFromRunning, enqueue, merge_order, must_wait, next_run
from pipeline.core.provenance import SOURCE_HEADER, encode_source
from pipeline.kafka.offsets import seek_all
from pipeline.kafka.records import Consumed
from pipeline.serde import skip_bytes_deserialize
from pipeline.sinks.kafka.task import Encoded, KafkaTask, KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction
from pipeline.state.changelog import Checkpoint
from pipeline.state.snapshot_format import Manifest
from pipeline.state.store import PartitionState
from pipeline.state.tables import TableStore
from pipeline.state.timed import TimedState


class MultiInputTask(WaitsFromRunning, KafkaTask):
    def __init__(self, ctx: KafkaTaskContext, partition: int, txn: Transaction) -> None:
        app = ctx.app
        self.topics: tuple[str, ...] = app.co_partitioned  # the streams, then the co-partitioned tables
        self.tables: dict[str, TableStore] = {spec.topic: TableStore(spec) for spec in app.table_specs.values()}
        self._table_names = {spec.topic: name for name, spec in app.table_specs.items()}
        super().__init__(ctx, partition, txn)
        self._index = {topic: i for i, topic in enumerate(self.topics)}
        self._decoders = {
            s.topic: (skip_bytes_deserialize(s.key_serde), skip_bytes_deserialize(s.value_serde)) for s in app.streams
        }
        self._names = {s.topic: s.name for s in app.streams}  # record.topic: as the App declares the input
        self.committed_offsets: dict[str, int | None] = dict.fromkeys(self.topics)  # per topic of p
        self.next_offsets: dict[str, int | None] = dict.fromkeys(self.topics)
        self._queues: dict[str, deque[Consumed]] = {topic: deque() for topic in self.topics}
        self._empty_since = dict.fromkeys(self.topics, time.monotonic())
        self._merge_order = merge_order(self.topics, self.tables)
        self._rank = {topic: i for i, topic in enumerate(self._merge_order)}
        self._runs = OrderRuns()  # of the open transaction, in the order taken
        self._idle_s = self.settings.max_task_idle_ms / 1000
        self.taken = 0  # records taken so far (all topics): the position of a timer firing
        self._burst = False  # stream timers due before the next record are more than fire in one turn

    def restored(self, state: PartitionState, snapshot_base: Manifest | None = None, end: int | None = None) -> None:
        super().restored(state, snapshot_base, end)
        self.taken = self.state.taken if isinstance(self.state, TimedState) else 0

    def table_views(self) -> dict[str, Mapping[Any, Any]]:
        return {**super().table_views(), **{self._table_names[t]: s.view for t, s in self.tables.items()}}

    # -- position and restore ------------------------------------------------------------------------------------
    def start_all(self, committed: Mapping[str, int | None], restore: bool) -> None:
        """The group's committed offset of every topic of p becomes its position."""
        self.committed_offsets, self.next_offsets = dict(committed), dict(committed)
        super().start(committed[self.input_topic], restore)

    def committed_offsets_by_topic(self) -> dict[str, int | None] | None:
        return dict(self.committed_offsets)

    def tables_restored(self, stores: Mapping[str, TableStore], positions: Mapping[str, int]) -> None:
        """The tables as their restore left them (name -> store), each read on from where its restore ended (topic ->
        offset: the end of its topic when the restore began), which may be past the committed offset
        (pipeline/state/table_restore.py)."""
        for name, store in stores.items():
            self.tables[self.ctx.app.table_specs[name].topic] = store
        for topic, position in positions.items():
            self.committed_offsets[topic] = self.next_offsets[topic] = position
        self.state.tables = self.table_views()

    def try_seek_back(self, consumer: Consumer) -> bool:
        """Every topic of p back to its committed offset; p RUNNING once all seeks took."""
        if not seek_all(consumer, self.partition, {topic: self.committed_offsets[topic] for topic in self.topics}):
            return False
        for queue in self._queues.values():
            queue.clear()
        self.seeks += 1
        self._transition(Phase.RUNNING)
        return True

    # -- processing ------------------------------------------------------------------------------------------------
    def process(self, messages: list[Consumed]) -> None:
        """Queues p's records by topic, then takes what can be taken in timestamp order."""
        if self._phase is not Phase.RUNNING:
            return
        enqueue(self._queues, self.next_offsets, messages)
        self._take_in_order()

    def tick(self, now_ms: int) -> None:
        """Every loop turn: a burst of due stream timers goes on, or the wall-clock timers due fire (at most
        TIMERS_PER_TURN); then an empty input may have been waited for long enough."""
        if self._phase is not Phase.RUNNING:
            return
        timers = self._timers
        if timers is not None:
            state = cast(TimedState, self.state)
            clock, now = ("stream", state.stream_time_ms) if self._burst else ("wall", now_ms)
            if now is not None and (self._burst or state.due("wall", now)):
                if not self.batch_open:
                    self._begin()
                if timers.fire(state, clock, now, self.taken) and self._burst:
                    self._hold(False)  # the burst is over: the records behind it go on
                self.txn.poll()
            if self._burst:
                return
        self._take_in_order()

    @property
    def holding(self) -> bool:
        return self._burst

    def _hold(self, holding: bool) -> None:
        """A burst of due stream timers holds every topic of p (fetching paused) until it is over."""
        if holding != self._burst:
            self._burst = holding
            self._pause_input(holding)

    def _pause_input(self, paused: bool) -> None:
        tps = [TopicPartition(topic, self.partition) for topic in self.topics]
        self.ctx.consumer.pause(tps) if paused else self.ctx.consumer.resume(tps)

    def _take_in_order(self) -> None:
        while self._phase is Phase.RUNNING and not self._burst:
            merged = self._next_run()
            if not merged:
                return
            self._process_merged(merged)

    def _next_run(self) -> list[Consumed]:
        """The records that can be taken now, in timestamp order (pipeline/core/merge.py: next_run)."""
        return next_run(
            self._queues, self._merge_order, self._rank, self._empty_since, self._must_wait, time.monotonic()
        )

    def _must_wait(self, topic: str, now: float) -> bool:
        """Whether an empty queue holds the others back (pipeline/core/merge.py: must_wait)."""

        def end_of() -> int:
            return int(self.ctx.consumer.get_watermark_offsets(TopicPartition(topic, self.partition), cached=True)[1])

        return must_wait(self._idle_s, self._empty_since[topic], now, end_of, self.next_offsets[topic])

    def _process_merged(self, merged: list[Consumed]) -> None:
        """KafkaTask.process's loop, for records of several topics: the source header names the topic, a table's
        records update the table, and every record extends the transaction's order runs."""
        partition, produce = self.partition, self.producer.produce
        index, tables, decoders, nexts, runs = self._index, self.tables, self._decoders, self.next_offsets, self._runs
        timers, timed = self._timers, cast(TimedState, self.state)
        processed = produced = 0
        for msg in merged:
            if self._phase is not Phase.RUNNING:
                break
            topic, offset = msg.topic(), msg.offset()
            if not self.batch_open:
                self._begin()
            if timers is not None and not timers.before_record(timed, self.taken, msg.timestamp()[1]):
                self._put_back(merged[processed:])  # more are due than fire in one turn: they wait for the burst
                self._hold(True)
                break
            i = index[topic]
            if topic in tables:
                tables[topic].apply(msg.key(), msg.value())
            else:
                outputs = self._attempt(msg, topic, offset, decoders[topic])
                if outputs:
                    self._produce_outputs(outputs, encode_source(partition, offset, i), produce)
                    produced += len(outputs)
            # Counted taken only once processed or dead-lettered: a record that stops p (_attempt raises) is not in
            # the transaction the runner then commits, so neither its order nor __eos.taken may name it.
            self.taken += 1
            runs.note(i)
            nexts[topic] = offset + 1
            if i == 0:
                self.next_offset = offset + 1
            self.batch_records += 1
            processed += 1
        if processed:
            self.note_batch(merged, merged[processed - 1], processed, produced)
        # The delivery reports: served once per poll by the runner (KafkaRunner._dispatch), as KafkaTask's are.

    def _put_back(self, records: list[Consumed]) -> None:
        """Records taken from their queues but not processed go back to the front of them, in order."""
        for msg in reversed(records):
            self._queues[msg.topic()].appendleft(msg)

    def _attempt(self, msg: Consumed, topic: str, offset: int, decoders: tuple[Any, Any]) -> list[Encoded] | None:
        decode_key, decode_value = decoders
        state = self.state
        state.begin_record()
        try:
            key = msg.key() if decode_key is None else decode_key(msg.key())
            value = msg.value() if decode_value is None else decode_value(msg.value())
            name = self._names[topic]
            record = Record(key, value, name, self.partition, offset, msg.timestamp()[1], msg.headers() or ())
            return [self._encode(o) for o in self.app.process(state, record)]
        except Exception as error:  # from decoding or from user code: poison until proven otherwise
            return self._retry(msg, error)

    def _produce_outputs(self, outputs: list[Encoded], source: bytes, produce: Any) -> None:
        header = (SOURCE_HEADER, source)
        for topic, out_key, out_value, out_partition, headers in outputs:
            headers = [*headers, header] if headers else [header]
            try:
                produce(topic, out_value, out_key, partition=out_partition, headers=headers)
            except BufferError:
                self._produce(topic, out_key, out_value, out_partition, headers)
            except KafkaException as e:
                self.txn.raise_classified("produce", e)

    # -- the runner's commit, and after an abort --------------------------------------------------------------------
    def prepare_commit(self) -> list[TopicPartition]:
        """Step 1: p's state changes and a checkpoint naming every topic's next offset and the order taken; the
        offsets of every topic with a position for step 2."""
        order = self._runs.encode()
        if isinstance(self.state, TimedState):
            self.state.note_taken(self.taken)
        checkpoint = Checkpoint(self.input_topic, self.partition, self.next_offset, dict(self.next_offsets), order)
        self._stage_changelog(checkpoint)
        self._staged += 1
        return [TopicPartition(t, self.partition, n) for t, n in self.next_offsets.items() if n is not None]

    def committed(self) -> None:
        with self.commit_lock:  # a query sees the tables and the offsets move with the state (core/queries.py)
            super().committed()
            for table in self.tables.values():
                table.commit()
            self.committed_offsets = dict(self.next_offsets)
        self._runs.clear()

    def rewind(self) -> None:
        for table in self.tables.values():
            table.undo_transaction()
        self.next_offsets = dict(self.committed_offsets)
        self._runs.clear()
        for queue in self._queues.values():
            queue.clear()
        self._hold(False)  # the queues are fetched again after the seek
        super().rewind()
        self.taken = self.state.taken if isinstance(self.state, TimedState) else 0
