"""Global tables (`App.global_tables`): every partition of each, held whole by every instance (docs/inputs.md).

restore()    before the process joins its group, so before any task processes: each table is read with
             read_committed from its low watermark up to the high watermarks captured when the restore began
             (read_uncommitted list-offsets: the read waits for a transaction left open by a dead producer to be
             aborted rather than stop at a last stable offset it pins, which would hide newer committed data)
poll()       every loop turn: what arrived since, applied (never undone: a global table only moves forward)
ask_targets() the high watermarks now, asked without waiting (PendingTargets); a partition taken over starts only
             once `reached(targets)`: whatever a previous owner of it read of a table was below those, so reads
             never go back in time across owners (docs/guarantees.md: table-reads-forward)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, cast

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.app import Table
from pipeline.kafka.offsets import (
    PendingOffsets,
    ReadToEndTimeout,
    TailReader,
    high_watermarks,
    low_watermarks,
    relearn_leaders,
)
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.state.tables import TableView

log = logging.getLogger(__name__)
Targets = dict[str, dict[int, int]]  # topic -> partition -> offset
PROGRESS_EVERY_S = 2.0


class PendingTargets:
    """A take-over's targets: the high watermarks of every global table, asked for without waiting.

    The poll loop never waits on the broker for them. It did: asked synchronously in the rebalance callback, a
    broker that had just died held the loop 10 s per try, and then EndOffsetsTimeout came out of poll and ended both
    members of a broker-fault run. Now the loop looks at the answer each turn (`result`); an ask that failed, or got
    no answer within REQUEST_TIMEOUT_MS, is asked again (PendingOffsets); after RESTORE_TIMEOUT_MS the take-over fails
    loudly, as a restore that cannot finish does. Asked later, the targets are no lower: reads still never go back in
    time."""

    def __init__(
        self,
        ask: Callable[[], dict[TopicPartition, Future[Any]]],
        refresh: Callable[[], object],
        request_timeout_s: float,
        give_up_s: float,
    ) -> None:
        # The admin client keeps the leaders it knew: after a broker restart every ask failed with
        # FENCED_LEADER_EPOCH until its metadata was refreshed (seen for minutes in a broker-fault run): `refresh`.
        what = "global tables: end offsets for a take-over"
        self._pending = PendingOffsets(what, ask, refresh, request_timeout_s, give_up_s)

    def result(self) -> Targets | None:
        """The targets once the broker answered; None until then. A negative end is asked again: read as a target
        it would be reached at once, and the tasks would start on tables not read yet."""
        offsets = self._pending.result()
        if offsets is None:
            return None
        targets: Targets = {}
        for tp, offset in offsets.items():
            targets.setdefault(tp.topic, {})[tp.partition] = offset
        return targets


class GlobalTable:
    """One global table: its data, the view `process` reads, and the consumer that follows its topic."""

    def __init__(self, name: str, spec: Table, consumer: Consumer) -> None:
        self.name, self.spec, self.consumer = name, spec, consumer
        self.data: dict[bytes | None, bytes] = {}
        self.view = TableView(spec, self.data)
        self.positions: dict[int, int] = {}  # partition -> next offset to read
        self.restored_records = 0

    def apply(self, messages: list[Consumed]) -> None:
        data = self.data
        for m in messages:
            value = m.value()
            if value is None:
                data.pop(m.key(), None)
            else:
                data[m.key()] = value
            self.positions[m.partition()] = m.offset() + 1


class GlobalTables:
    def __init__(
        self,
        specs: Mapping[str, Table],
        make_consumer: Callable[[], Consumer],
        admin: AdminClient,
        metrics: Metrics,
        request_timeout_s: float,
        restore_timeout_s: float,
    ) -> None:
        self.tables = {name: GlobalTable(name, spec, make_consumer()) for name, spec in specs.items()}
        self._admin, self._metrics = admin, metrics
        self._timeout_s, self._restore_timeout_s = request_timeout_s, restore_timeout_s

    @property
    def views(self) -> dict[str, TableView]:
        return {name: table.view for name, table in self.tables.items()}

    def restore(self) -> None:
        """Every table read up to the high watermarks of now; then followed from there. Blocks: call it before the
        process joins its group. RestoreError-like ReadToEndTimeout after RESTORE_TIMEOUT_MS."""
        for table in self.tables.values():
            started = time.monotonic()
            topic = table.spec.topic
            partitions = self._partitions(topic)
            starts = low_watermarks(self._admin, topic, partitions, self._timeout_s)
            ends = high_watermarks(self._admin, topic, partitions, self._timeout_s)
            reader = TailReader(table.consumer, topic, starts, ends)
            self._read(table, reader, started)
            table.positions = dict(reader.positions)
            table.consumer.assign([TopicPartition(topic, p, offset) for p, offset in table.positions.items()])
            seconds = time.monotonic() - started
            self._metrics.observe_table_restore(table.name, seconds, table.restored_records, len(table.data))
            log.info(
                "global table %s (%s): %d keys from %d records in %.2fs",
                table.name,
                topic,
                len(table.data),
                table.restored_records,
                seconds,
            )

    def _read(self, table: GlobalTable, reader: TailReader, started: float) -> None:
        deadline, report_at = started + self._restore_timeout_s, started + PROGRESS_EVERY_S
        while not reader.done:
            if time.monotonic() > deadline:
                raise ReadToEndTimeout(reader.topic, reader.stuck())
            batch = reader.step()  # a TailReader hands on records only
            table.apply(batch)
            table.restored_records += len(batch)
            if time.monotonic() >= report_at:
                report_at += PROGRESS_EVERY_S
                left = sum(end - reader.positions[p] for p, end in reader.ends.items())
                log.info("global table %s: %d records read, %d offsets to go", table.name, table.restored_records, left)

    def poll(self, max_records: int = 5_000) -> int:
        """Applies what arrived since the last call, without waiting; the number of records applied."""
        applied = 0
        for table in self.tables.values():
            messages = [m for m in table.consumer.consume(max_records, 0) if m.error() is None]
            if messages:
                table.apply(cast(list[Consumed], messages))  # the errors dropped: records
                applied += len(messages)
        return applied

    def ask_targets(self) -> PendingTargets:
        """The high watermarks of every table now (read_uncommitted list-offsets), without waiting for the answer."""
        request = {
            TopicPartition(table.spec.topic, p): OffsetSpec.latest()
            for table in self.tables.values()
            for p in sorted(table.positions)
        }

        def ask() -> dict[TopicPartition, Future[Any]]:
            level = IsolationLevel.READ_UNCOMMITTED
            return self._admin.list_offsets(request, isolation_level=level, request_timeout=self._timeout_s)

        topics = [table.spec.topic for table in self.tables.values()]

        def refresh() -> None:
            relearn_leaders(self._admin, topics, self._timeout_s)  # without waiting: this is the loop's thread

        return PendingTargets(ask, refresh, self._timeout_s, self._restore_timeout_s)

    def reached(self, targets: Targets) -> bool:
        """Whether every table has been read up to `targets` (the consumer's position counts: markers and aborted
        records it stepped over occupy offsets)."""
        for table in self.tables.values():
            wanted = targets.get(table.spec.topic, {})
            behind = [p for p, end in wanted.items() if table.positions.get(p, 0) < end]
            if behind:
                positions = table.consumer.position([TopicPartition(table.spec.topic, p) for p in behind])
                for tp in positions:
                    if tp.offset >= 0:
                        table.positions[tp.partition] = max(table.positions[tp.partition], tp.offset)
                if any(table.positions.get(p, 0) < wanted[p] for p in behind):
                    return False
        return True

    def update_gauges(self) -> None:
        for table in self.tables.values():
            lag = 0
            for p, position in table.positions.items():
                _, high = table.consumer.get_watermark_offsets(TopicPartition(table.spec.topic, p), cached=True)
                lag += max(0, high - position) if high >= 0 else 0
            self._metrics.table_gauges(table.name, len(table.data), lag)

    def close(self) -> None:
        for table in self.tables.values():
            table.consumer.close()

    def _partitions(self, topic: str) -> list[int]:
        metadata = self._admin.list_topics(topic, timeout=self._timeout_s)
        return sorted(metadata.topics[topic].partitions)
