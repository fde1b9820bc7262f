"""What a process keeps for one input partition it owns, the same for both sinks: the partition's phase
(pipeline/core/lifecycle.py), its state, where it stands in the input, the batch of records it is processing, and
what happens to a record that fails (pipeline/core/processing.py). Each sink's task (KafkaTask in
pipeline/sinks/kafka/task.py, PostgresTask in pipeline/sinks/postgres/task.py) adds how it processes a batch and
what it writes; neither commits anything itself: its runner does.

    start(committed)    the committed offset becomes the position                NEW -> RESTORING (or RUNNING)
    restored(state)     the state is complete; the input is sought back to the committed offset before anything is
                        processed (docs/guarantees.md: rewind-after-abort)     RESTORING -> RUNNING -> REWINDING
    try_seek_back()     the seek to the committed offset; until it succeeds p stays REWINDING      -> RUNNING
    batch_committed()   after the runner's commit: the state and the committed offset move forward
    rewind()            after an abort: the state is undone to the last commit, the position goes back to it
    retry_record()      a record whose first attempt failed: retried, then a dead letter, or p stops (a mistake in
                        the code; ON_POISON=stop; a dead-letter storm, `StormGuard`)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from pipeline.app import App
from pipeline.core.deadletter import DeadLetter
from pipeline.core.lifecycle import Lifecycle, Phase, commit_deadline
from pipeline.core.processing import Attempts, PoisonRecordStop, where
from pipeline.core.schedule import Schedule
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.state import PartitionState

log = logging.getLogger(__name__)
Outputs = TypeVar("Outputs")


class DeadLetterStorm(PoisonRecordStop):
    """DEAD_LETTER_STORM records in a row failed with the same error type: a bug, not bad records. p stops rather
    than drain its input into the dead-letter topic (docs/guarantees.md: fail-fast)."""

    def __init__(self, at: str, error_type: str, count: int, first: str) -> None:
        super().__init__(
            f"{at}: dead-letter storm: {count} records in a row failed with {error_type} (from {first}; the "
            f"{count - 1} before this one are dead letters already)"
        )
        self.fix = (
            f"Find the cause in those dead letters' eos.dlq.error.message, fix the code or the input, restart; "
            f"replay the dead letters if they should be processed. DEAD_LETTER_STORM={count} sets how many in a row "
            "stop a partition (0: never)."
        )


@dataclass
class StormGuard:
    """The dead-letter storm guard: how many dead letters of one error type came in a row, with no record processed
    between them. Positions are record sequence numbers (records of earlier batches + batch_records): nothing is added
    to the hot path, a record that succeeds shows as a gap. A Reject (a dead letter on purpose) does not count, and
    ends a run as a success does. Timers keep a run of their own (Task.timer_storm), ended by a timer that fires
    without failing."""

    limit: int  # DEAD_LETTER_STORM; 0: off
    error_type: str = ""
    count: int = 0
    first: str = ""  # where the run began
    _next: int = -1  # the sequence number at which the next dead letter continues the run

    def note(self, error_type: str, at: str, sequence: int, after: int) -> None:
        """A dead letter of `error_type` at `sequence`; `after`: where the next one would continue the run. Raises
        DeadLetterStorm at the limit."""
        if sequence != self._next or error_type != self.error_type:
            self.error_type, self.count, self.first = error_type, 0, at
        self.count += 1
        self._next = after
        if self.limit and self.count >= self.limit:
            raise DeadLetterStorm(at, error_type, self.count, self.first)

    _committed: tuple[str, int, str, int] = ("", 0, "", -1)

    def reset(self) -> None:
        self._next, self.count = -1, 0

    def committed(self) -> None:
        self._committed = (self.error_type, self.count, self.first, self._next)

    def restore(self) -> None:
        """Back to the last commit (an abort): the run as the committed dead letters left it."""
        self.error_type, self.count, self.first, self._next = self._committed


class Task(Lifecycle):
    def __init__(
        self,
        app: App,
        settings: Settings,
        metrics: Metrics,
        input_topic: str,
        partition: int,
        attempts: Attempts,
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__()
        # The loop's (pipeline/core/schedule.py): told when a batch opens or fills and when p changes phase. None: a
        # task outside a loop (tests, tools), with one of its own.
        self.schedule = schedule or Schedule(settings.commit_interval_ms, settings.commit_max_records)
        self.app, self.settings, self.metrics = app, settings, metrics
        self.input_topic = input_topic
        self.partition = partition
        self.label = str(partition)
        self.state = PartitionState(app.state_serde)
        self.committed_offset: int | None = None  # next input offset after the last commit (None: the beginning)
        # Held while the state and the committed offset move forward together (once per commit, never per record):
        # a query reads both under it (pipeline/core/queries.py). Reentrant: a task with tables holds it around this
        # one's batch_committed and its tables' commits.
        self.commit_lock = threading.RLock()
        self.next_offset: int | None = None  # next input offset to process
        # Seeks back so far. Records of p polled before one are from the old position: the runner never hands them
        # over (with PRODUCERS=per_process, another partition's abort rewinds p between the poll and p's turn).
        self.seeks = 0
        self.batch_open = False  # records (or timers) processed since the last commit, or a transaction begun
        self.batch_records = 0
        self._batch_started = 0.0
        self._batch_first_timestamp = self._batch_last_timestamp = 0  # of its input records (ms): end-to-end latency
        self._records_in = metrics.records_in.labels(self.label)  # labels() is slow: resolved once
        self._records_out = metrics.records_out.labels(self.label)
        self._committed_count = metrics.transactions.labels(self.label, "committed")  # per commit: at 384 partitions
        self._attempts = attempts
        self._storm = StormGuard(settings.dead_letter_storm)
        self.timer_storm = StormGuard(settings.dead_letter_storm)  # timers' own run: they fire between records
        self._records_before = 0  # records of committed batches: with batch_records, a record's sequence number

    def _transition(self, to: Phase) -> None:
        super()._transition(to)
        self.schedule.moved(self)

    # -- position -------------------------------------------------------------------------------------------------
    def start(self, committed_offset: int | None, restore: bool) -> None:
        """The committed offset, read after the fence, becomes the position; the state is restored first if asked."""
        self.committed_offset = self.next_offset = committed_offset
        self._transition(Phase.RESTORING if restore else Phase.RUNNING)

    def restored(self, state: PartitionState) -> None:
        """The state is complete (docs/guarantees.md: complete-restore). The position comes from the committed offset,
        never from the fetcher: a record of p fetched while p restored was dropped, and resuming from the fetched
        position would skip it. So p waits for the seek back (REWINDING) before it processes anything."""
        self.state = state
        self._transition(Phase.RUNNING)
        self._transition(Phase.REWINDING)

    def try_seek_back(self, consumer: Consumer) -> bool:
        """Puts the input position at the committed offset; True once done (p RUNNING), False to try again later."""
        offset = OFFSET_BEGINNING if self.committed_offset is None else self.committed_offset
        try:
            consumer.seek(TopicPartition(self.input_topic, self.partition, offset))
        except KafkaException as e:
            log.info("p%d: seek back to %s not possible yet (%s); retrying", self.partition, offset, e)
            return False
        self.seeks += 1
        self._transition(Phase.RUNNING)
        return True

    # -- failures -------------------------------------------------------------------------------------------------
    def retry_record(self, msg: Consumed, error: Exception, try_once: Callable[[], Outputs]) -> Outputs | DeadLetter:
        """After a failed first attempt at `msg` (the hot paths make it inline): the shared retry path, and the storm
        guard on the dead letter it gives up with (raised before the dead letter is written: p stops at `msg`)."""
        outcome = self._attempts.retry(self.state, msg, error, try_once)
        if isinstance(outcome, DeadLetter) and not outcome.rejected:
            sequence = self._records_before + self.batch_records  # the hot loops count the record after this
            self._storm.note(outcome.error_type, where(msg), sequence, sequence + 1)
        return outcome

    # -- the batch ------------------------------------------------------------------------------------------------
    def open_batch(self) -> None:
        self.batch_open = True
        self._batch_started = time.monotonic()
        self.schedule.opened(self._batch_started)
        self.batch_records = 0
        self._batch_first_timestamp = self._batch_last_timestamp = 0

    def commit_deadline(self) -> float | None:
        s = self.settings
        if not self.batch_open:
            return None
        return commit_deadline(self._batch_started, self.batch_records, s.commit_interval_ms, s.commit_max_records)

    def note_batch(self, messages: list[Consumed], last: Consumed, processed: int, produced: int) -> None:
        """After a batch of `processed` records ending with `last`: counters, and the timestamps the end-to-end
        latency is measured from (per batch, not per record: it costs nothing on the hot path)."""
        if processed:
            self._batch_first_timestamp = self._batch_first_timestamp or messages[0].timestamp()[1]
            self._batch_last_timestamp = last.timestamp()[1]
            if self.batch_records >= self.settings.commit_max_records:
                self.schedule.filled()
        self._records_in.inc(processed)
        self._records_out.inc(produced)

    def batch_committed(self) -> None:
        """The runner committed the batch: the state's changes and the position are the committed ones now."""
        with self.commit_lock:
            self.state.commit()
            self.committed_offset = self.next_offset
        self.batch_open = False
        self._records_before += self.batch_records
        self.batch_records = 0
        self._storm.committed()
        self.timer_storm.committed()
        self.metrics.observe_end_to_end(self._batch_first_timestamp, self._batch_last_timestamp)
        self._committed_count.inc()

    def rewind(self) -> None:
        """The runner aborted the batch: the state goes back to the last commit, and so does the position (the
        seek is pending until try_seek_back succeeds)."""
        self.batch_open = False
        self.state.undo_transaction()
        # The aborted dead letters are gone: the guards go back to the last commit, and count them again.
        self._storm.restore()
        self.timer_storm.restore()
        self.next_offset = self.committed_offset
        self.metrics.transactions.labels(self.label, "aborted").inc()
        self._transition(Phase.REWINDING)
