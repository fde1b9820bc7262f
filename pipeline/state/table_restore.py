"""Task p's co-partitioned tables (`App.tables`), rebuilt from their own topics: a table's topic is its changelog, so
nothing of it is in the app's changelog (docs/inputs.md).

Each table's partition p is read with read_committed from its low watermark up to the high watermark captured when
the restore began (after the fence), in steps between polls like the changelog (docs/guarantees.md:
restore-keeps-membership). Restoring to the end rather than to the committed offset is what a compacted topic allows:
compaction may have removed a key's older value in favour of a newer one beyond the committed offset, so only the end
is a state the topic can still give. The table may then be ahead of the inputs; the records processed again see it as
it is now, never older (docs/guarantees.md: table-reads-forward). The task goes on reading each table from where
its restore ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.app import Table
from pipeline.kafka.offsets import (
    EndOffsetsTimeout,
    OffsetRequest,
    PendingOffsets,
    TailReader,
    ask_offsets,
    relearn_leaders,
)
from pipeline.state.restore_checks import RestoreError
from pipeline.state.tables import TableStore


class TableRestore:
    def __init__(
        self,
        make_consumer: Callable[[], Consumer],
        admin: AdminClient,
        specs: Mapping[str, Table],
        partition: int,
        request_timeout_s: float,
        give_up_s: float | None = None,
    ) -> None:
        self.partition = partition
        self.stores = {name: TableStore(spec) for name, spec in specs.items()}
        self.records = 0
        self._specs, self._make_consumer = dict(specs), make_consumer
        self._readers: dict[str, TailReader] = {}
        self._consumers: list[Consumer] = []
        # The bounds are asked without waiting, as the changelog's are (pipeline/state/restore.py): this is the poll
        # loop's thread.
        wanted: dict[tuple[str, str], OffsetRequest] = {}
        for name, spec in specs.items():
            tp = TopicPartition(spec.topic, partition)
            wanted[(name, "low")] = OffsetRequest(tp, OffsetSpec.earliest())
            wanted[(name, "end")] = OffsetRequest(tp, OffsetSpec.latest())
        topics = [spec.topic for spec in specs.values()]
        self._bounds = PendingOffsets(
            f"p{partition}'s tables: offsets of {', '.join(topics)}",
            ask_offsets(admin, wanted, request_timeout_s),
            lambda: relearn_leaders(admin, topics, request_timeout_s),
            request_timeout_s,
            give_up_s,
        )

    @property
    def done(self) -> bool:
        return len(self._readers) == len(self._specs) and all(reader.done for reader in self._readers.values())

    @property
    def positions(self) -> dict[str, int]:
        """Where each table's read ended (or stands): topic -> the next offset of partition p."""
        return {reader.topic: reader.positions[self.partition] for reader in self._readers.values()}

    def step(self, budget_s: float) -> bool:
        """Reads for about budget_s; True once every table reached its end. RestoreError once the bounds were not
        known within RESTORE_TIMEOUT_MS."""
        if len(self._readers) < len(self._specs) and not self._start_readers():
            return False
        until = time.monotonic() + budget_s
        for name, reader in self._readers.items():
            store = self.stores[name]
            while not reader.done and time.monotonic() < until:
                for m in reader.step(max(0.001, until - time.monotonic())):
                    store.load(m.key(), m.value())
                    self.records += 1
        return self.done

    def _start_readers(self) -> bool:
        try:
            bounds = self._bounds.result()
        except EndOffsetsTimeout as e:
            raise RestoreError(f"p{self.partition}: the restore of its tables timed out: {e}") from e
        if bounds is None:
            return False
        p = self.partition
        for name, spec in self._specs.items():
            consumer = self._make_consumer()
            self._consumers.append(consumer)
            start, end = bounds[(name, "low")], bounds[(name, "end")]
            self._readers[name] = TailReader(consumer, spec.topic, {p: start}, {p: end})
        return True

    def stuck(self) -> str:
        if len(self._readers) < len(self._specs):
            return self._bounds.stuck()
        return "; ".join(f"{r.topic}: {r.stuck()}" for r in self._readers.values() if not r.done)

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.close()
