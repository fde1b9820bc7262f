"""Restore of one partition's state from its changelog, in steps that never block the poll loop for long.

The changelog of p is read with read_committed from its start to the high watermark captured when the restore
begins (after fencing, so no transaction of p's own transactional.id is pending). The last checkpoint read must
name the group's committed offset of p: both were written by the same transactions, so any difference means
something is missing, and p refuses to start rather than run on wrong state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline.changelog import CHECKPOINT_KEY, Checkpoint, is_checkpoint
from pipeline.offsets import TailReader, high_watermarks, low_watermarks
from pipeline.state import PartitionState

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 2.0


class RestoreError(RuntimeError):
    """p's state cannot be restored completely; the message says what is missing and how to repair it."""


class ChangelogRestore:
    def __init__(
        self,
        make_consumer: Callable[[], Consumer],
        admin: AdminClient,
        changelog_topic: str,
        partition: int,
        state: PartitionState,
        committed_offset: int | None,
        timeout_s: float,
        request_timeout_s: float,
        strict: bool = True,
    ) -> None:
        self.strict = strict  # at-least-once writes the checkpoint before committing offsets: it may run ahead
        self.topic = changelog_topic
        self.partition = partition
        self.state = state
        self.committed_offset = committed_offset
        self.records = 0
        self.last_checkpoint: Checkpoint | None = None
        self.started = time.monotonic()
        self._deadline = self.started + timeout_s
        self._next_progress = self.started + PROGRESS_EVERY_S
        start = low_watermarks(admin, changelog_topic, [partition], request_timeout_s)[partition]
        self.end = high_watermarks(admin, changelog_topic, [partition], request_timeout_s)[partition]
        if start > 0:
            raise RestoreError(
                f"{changelog_topic}[{partition}] starts at offset {start}, not 0: changes were deleted (retention?) "
                "and there is no full snapshot to start from. Repair: restore the changelog's retention.ms=-1 and "
                "rebuild the state (reprocess the input into a new app id), or publish a full snapshot."
            )
        self._consumer = make_consumer()
        self._reader = TailReader(self._consumer, changelog_topic, {partition: start}, {partition: self.end})

    @property
    def done(self) -> bool:
        return self._reader.done

    def step(self, budget_s: float) -> bool:
        """Reads for at most budget_s; True once p's state is complete and verified."""
        until = time.monotonic() + budget_s
        while not self._reader.done and time.monotonic() < until:
            self._apply(self._reader.step(timeout_s=min(0.05, budget_s)))
        if time.monotonic() > self._next_progress:
            self._next_progress += PROGRESS_EVERY_S
            log.info("restoring p%d: %d records, position %d of %d", self.partition, self.records,
                     self._reader.positions[self.partition], self.end)
        if not self._reader.done:
            if time.monotonic() > self._deadline:
                raise RestoreError(f"restore of p{self.partition} timed out: {self._reader.stuck()}")
            return False
        self._verify_checkpoint()
        return True

    def close(self) -> None:
        self._consumer.close()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def _apply(self, messages: list) -> None:
        entries = []
        for m in messages:
            key = m.key()
            if key == CHECKPOINT_KEY and is_checkpoint(key, m.headers()):
                self.last_checkpoint = Checkpoint.decode(m.value())
            else:
                entries.append((key.decode(), m.value()))
        self.state.load(entries)
        self.records += len(messages)

    def _verify_checkpoint(self) -> None:
        covered = self.last_checkpoint.next_input_offset if self.last_checkpoint else None
        if covered != self.committed_offset and not self.strict:
            log.warning("p%d: checkpoint %s != committed offset %s: records in between are applied again "
                        "(at-least-once)", self.partition, covered, self.committed_offset)
        elif covered != self.committed_offset:
            raise RestoreError(
                f"p{self.partition}: the changelog's last checkpoint covers input offset {covered} but the group's "
                f"committed offset is {self.committed_offset}. They are written in one transaction, so one of them "
                "was lost (expired group offsets? a deleted or wrong changelog topic?). Repair: reset the group's "
                f"offset of p{self.partition} to {covered} if the changelog is right, or start a new app id."
            )
