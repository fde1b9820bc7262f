"""Restore of one partition's state: latest complete full snapshot + the changelog since, in steps that never block
the poll loop for long (docs/guarantees.md: restore-keeps-membership, complete-restore).

    offsets   the changelog's low and high watermarks and the snapshot topic's bounds, asked without waiting
              (PendingOffsets): the poll loop looks for the answer each step and never waits on a broker
    scan      the snapshot topic's partition p is scanned back from its end for manifests (snapshot_finder.py)
    load      the newest manifest's chunks are read and verified; a corrupt or incomplete snapshot is skipped with a
              warning and the next older one is tried; with none left, the changelog from offset 0 is the base
    tail      the changelog of p is read with read_committed from the offset the snapshot covers up to the high
              watermark captured when the restore began (after fencing, so no transaction of p's own is pending)
    verify    the last checkpoint (from the tail, or the snapshot's input offset when the tail has none) must name
              the group's committed offset of p: both come from the same transactions, so any difference means
              something is missing, and p refuses to start rather than run on wrong state

If the changelog no longer reaches back to the snapshot (retention, delete_records) p refuses to start with a
RestoreError that says what is missing and how to repair it; it never starts from empty state silently. Records
deleted under a running restore (the compaction job's retention) make it start over, a bounded number of times.
`records` counts changelog records read, `snapshot_entries` the state entries taken from the snapshot.

A promotion starts from a standby copy instead (pipeline/state/standby.py: p's state as of a changelog offset, kept
warm by another member's changelog reads): only the tail from that offset is read, and verified the same way.

ChangelogRestore restores one partition; pipeline/state/restore_manager.py keeps every restore of one runner.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline.kafka.offsets import CheckedConsumer, OffsetsTruncated, TailReader
from pipeline.kafka.records import Consumed
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint
from pipeline.state.changelog_apply import apply_changelog
from pipeline.state.disk_store import DiskBacked
from pipeline.state.restore_checks import RestoreError, truncated, verify_checkpoint
from pipeline.state.restore_setup import StandbyCopy, ask_bounds, warm_metadata
from pipeline.state.snapshot_finder import ChunkLoad, InvalidSnapshot, ManifestScan, precheck
from pipeline.state.snapshot_format import Manifest

if TYPE_CHECKING:
    from pipeline.state.table_restore import TableRestore

__all__ = ["ChangelogRestore", "RestoreError", "RestorePhase", "StandbyCopy"]
log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 2.0
MAX_RESTARTS = 3


class RestorePhase(enum.Enum):
    OFFSETS = "offsets"  # the changelog's and the snapshot topic's bounds asked for, not answered yet
    SCAN = "scan"  # looking for the newest manifest in the snapshot topic
    LOAD = "load"  # reading and verifying that snapshot's chunks
    TAIL = "tail"  # reading the changelog from where the snapshot ends up to the high watermark
    DONE = "done"


class ChangelogRestore:
    def __init__(
        self,
        make_consumer: Callable[[], Consumer],
        admin: AdminClient,
        changelog_topic: str,
        partition: int,
        state: PartitionState,
        committed_offset: int | Mapping[str, int | None] | None,
        timeout_s: float,
        request_timeout_s: float,
        strict: bool = True,
        snapshot_topic: str | None = None,
        base: StandbyCopy | None = None,
        verify: bool = True,
    ) -> None:
        self.strict = strict  # at-least-once writes the checkpoint before committing offsets: it may run ahead
        self.verify = verify  # False for a standby's warm-up: nobody's committed offset to match yet
        self.topic = changelog_topic
        self.snapshot_topic = snapshot_topic
        self.partition = partition
        self.state = state
        self.committed_offset = committed_offset
        self.records = 0  # changelog records read
        self.snapshot_entries = 0  # state entries taken from the full snapshot
        self.snapshot_records = 0  # records read from the snapshot topic (manifests scanned + chunks)
        self.snapshot: Manifest | None = None
        self.skipped: list[str] = []  # snapshots found invalid, with the reason
        self.last_checkpoint: Checkpoint | None = None
        self.tables: TableRestore | None = None  # the co-partitioned tables' restore, once finished (RestoreManager)
        self.started = time.monotonic()
        self.snapshot_seconds = 0.0  # finding and loading the snapshot
        self.tail_seconds = 0.0  # reading the changelog tail
        self.phase = RestorePhase.SCAN
        self._admin = admin
        self._request_timeout_s = request_timeout_s
        self._deadline = self.started + timeout_s
        self._next_progress = self.started + PROGRESS_EVERY_S
        self.restarts = 0
        self._make_consumer = make_consumer
        self._consumer = make_consumer()
        self._checked = CheckedConsumer(self._consumer)
        # The changelog tail is fetched by a second consumer while the snapshot's chunks load (prefetch).
        self._tail_consumer: Consumer | None = None
        self._tail_reader: TailReader | None = None
        self._base = base  # a standby copy of p to start from (pipeline/state/standby.py); used once
        self.standby_keys: int | None = None  # keys taken from a standby copy
        self.changelog_start = self.end = -1  # not known before the broker answers (phase OFFSETS)
        self._warmed = warm_metadata(self._consumer, [t for t in (changelog_topic, snapshot_topic) if t is not None])
        self._begin()

    # -- set-up --------------------------------------------------------------------------------------------------
    def _begin(self) -> None:
        """Asks for the bounds without waiting (restore_setup.py); `_step_offsets` takes the answer at a later step."""
        self._scan: ManifestScan | None = None
        self._load: ChunkLoad | None = None
        self._reader: TailReader | None = None
        self._bounds = ask_bounds(self._admin, self.topic, self.snapshot_topic, self.partition, self._request_timeout_s)
        self.phase = RestorePhase.OFFSETS

    @property
    def offsets_known(self) -> bool:
        """Whether the broker answered the set-up's ask; the next step takes the answer (tests, tools)."""
        return self.phase is not RestorePhase.OFFSETS or self._bounds.result() is not None

    def _step_offsets(self) -> bool:
        """True once the broker answered and the restore moved on to its next phase."""
        bounds = self._bounds.result()
        if bounds is None:
            return False
        self.changelog_start, self.end = bounds["changelog_low"], bounds["end"]
        base, self._base = self._base, None  # a restore started again starts from nothing
        if base is not None and self._from_copy(base):
            return True
        if self.snapshot_topic is not None:
            low, end, p = bounds["snapshot_low"], bounds["snapshot_end"], self.partition
            self._scan = ManifestScan(self._checked, self.snapshot_topic, p, low, end, self._skip_unreadable)
            self.phase = RestorePhase.SCAN
        else:
            self._start_tail(None)
        return True

    def _from_copy(self, copy: StandbyCopy) -> bool:
        """Promotion: p's standby copy (state, snapshot and checkpoint as of changelog offset copy.position) is the
        base, and the tail is read from there. Only if that offset is still in the changelog; the checkpoint is
        checked at the end as for any restore (docs/guarantees.md: standby-copies)."""
        p = self.partition
        if not self.changelog_start <= copy.position <= self.end:
            log.warning(
                "p%d: the standby copy stands at changelog offset %d, outside %d..%d (deleted or recreated?); "
                "restoring from the snapshot instead",
                p,
                copy.position,
                self.changelog_start,
                self.end,
            )
            self._clear_state()
            return False
        self.snapshot, self.last_checkpoint, self.standby_keys = copy.snapshot, copy.last_checkpoint, len(self.state)
        log.info(
            "p%d: from the standby copy (%d keys, changelog < %d); changelog tail %d..%d",
            p,
            self.standby_keys,
            copy.position,
            copy.position,
            self.end,
        )
        self._reader = TailReader(self._checked, self.topic, {p: copy.position}, {p: self.end})
        self.phase = RestorePhase.TAIL
        return True

    def _restart(self, why: str) -> None:
        """Records were deleted under the restore: start over, a bounded number of times."""
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise RestoreError(
                f"p{self.partition}: records kept being deleted under the restore ({why}); gave up "
                f"after {MAX_RESTARTS} restarts. Is a compaction job deleting too eagerly?"
            )
        log.warning("p%d: %s; restarting the restore", self.partition, why)
        self._start_over()

    def _start_over(self) -> None:
        """From nothing, from the snapshot (never from the standby copy again)."""
        self.records = self.snapshot_entries = 0
        self.standby_keys = None
        self.snapshot = None
        self.last_checkpoint = None
        self._clear_state()
        self._drop_prefetch()
        self._begin()

    def _clear_state(self) -> None:
        if isinstance(self.state, DiskBacked):  # a disk store is wiped whole, its local checkpoint with it
            self.state.clear_all()
            return
        self.state.load((key, None) for key in list(self.state))

    # -- the steps -----------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.phase is RestorePhase.DONE

    def step(self, budget_s: float) -> bool:
        """Works for at most about budget_s; True once p's state is complete and verified."""
        until = time.monotonic() + budget_s
        try:
            while self.phase is not RestorePhase.DONE and time.monotonic() < until:
                remaining = max(0.001, until - time.monotonic())
                if self.phase is RestorePhase.OFFSETS:
                    if not self._step_offsets():
                        break  # not answered yet: the loop goes on, and looks again at the next step
                elif self.phase is RestorePhase.SCAN:
                    self._step_scan(remaining)
                elif self.phase is RestorePhase.LOAD:
                    self._step_load(remaining)
                else:
                    self._step_tail(remaining)
        except OffsetsTruncated as e:
            self._restart(str(e))
            return False
        self._progress()
        if self.phase is not RestorePhase.DONE:
            if time.monotonic() > self._deadline:
                raise RestoreError(
                    f"restore of p{self.partition} timed out in phase {self.phase.value}: {self._stuck()}"
                )
            return False
        if self.verify:
            try:
                self._verify_checkpoint()
            except RestoreError as e:
                if self.standby_keys is None:
                    raise
                self._discard_copy(str(e))  # a wrong copy is not a wrong changelog: the full restore decides
                return False
        if isinstance(self.state, DiskBacked):  # the disk store covers the changelog below `end` now: recorded
            self.state.store.mark(self.end, self.last_checkpoint, self.snapshot)
        return True

    def _discard_copy(self, why: str) -> None:
        """Not records deleted under the restore: a start over that is not counted against MAX_RESTARTS."""
        log.error("p%d: the standby copy does not match (%s); restoring from the snapshot instead", self.partition, why)
        self._start_over()

    def _step_scan(self, budget_s: float) -> None:
        scan = self._scan
        assert scan is not None  # phase SCAN reads a scan (_begin)
        scan.step(budget_s)
        self.snapshot_records = scan.records
        found = scan.next_candidate()
        if found is not None:
            offset, manifest = found
            try:
                precheck(manifest, self.partition, self.topic, self.end, scan.low)
            except InvalidSnapshot as e:
                self._invalid(offset, manifest, str(e))
                return
            if manifest.changelog_offset < self.changelog_start:
                self._refuse_truncated(manifest)
            self._load = ChunkLoad(self._checked, scan.topic, self.partition, offset, manifest)
            self.phase = RestorePhase.LOAD
            self._prefetch(manifest.changelog_offset)
        elif scan.exhausted:
            self._start_tail(None)

    def _step_load(self, budget_s: float) -> None:
        load = self._load
        assert load is not None  # phase LOAD reads a load (_step_scan)
        load.step(budget_s)
        if not load.done:
            return
        self.snapshot_records += load.records
        try:
            entries = load.finish()
        except InvalidSnapshot as e:
            self._load = None
            self.phase = RestorePhase.SCAN
            self._invalid(load.manifest_offset, load.manifest, str(e))
            return
        self._load = None
        self.state.load(entries)  # a dict: one C-level update
        self.snapshot_entries = len(entries)
        self._start_tail(load.manifest)

    def _start_tail(self, manifest: Manifest | None) -> None:
        start = manifest.changelog_offset if manifest is not None else 0
        if self.changelog_start > start:
            self._refuse_truncated(manifest)
        self.snapshot = manifest
        if manifest is not None:
            log.info(
                "p%d: snapshot %s (generation %d, %d entries, covers changelog < %d and input < %s); "
                "changelog tail %d..%d",
                self.partition,
                manifest.snapshot_id,
                manifest.generation,
                manifest.entries,
                manifest.changelog_offset,
                manifest.input_offset,
                start,
                self.end,
            )
        elif self.skipped:
            log.warning(
                "p%d: no usable full snapshot (%s); restoring from the whole changelog",
                self.partition,
                "; ".join(self.skipped),
            )
        if self._tail_reader is not None and self._tail_start == start:
            self._reader = self._tail_reader  # already fetching since the snapshot was chosen
        else:
            self._drop_prefetch()
            self._reader = TailReader(self._checked, self.topic, {self.partition: start}, {self.partition: self.end})
        self.phase = RestorePhase.TAIL
        self.snapshot_seconds = time.monotonic() - self.started

    def _step_tail(self, budget_s: float) -> None:
        until = time.monotonic() + budget_s
        reader = self._reader
        assert reader is not None  # phase TAIL reads a reader (_start_tail)
        while not reader.done and time.monotonic() < until:
            self._apply(reader.step(timeout_s=min(0.05, budget_s)))
        if reader.done:
            self.phase = RestorePhase.DONE
            self.tail_seconds = time.monotonic() - self.started - self.snapshot_seconds

    # -- failures --------------------------------------------------------------------------------------------------
    def _skip_unreadable(self, offset: int, why: str) -> None:
        self.skipped.append(f"manifest at {self.snapshot_topic}[{self.partition}]@{offset}: {why}")
        log.warning(
            "p%d: ignoring the manifest at %s[%d]@%d: %s",
            self.partition,
            self.snapshot_topic,
            self.partition,
            offset,
            why,
        )

    def _invalid(self, offset: int, manifest: Manifest, why: str) -> None:
        self.skipped.append(f"snapshot {manifest.snapshot_id} (generation {manifest.generation}): {why}")
        log.warning(
            "p%d: snapshot %s (generation %d, manifest at %s[%d]@%d) is not usable: %s; falling back to "
            "the previous one",
            self.partition,
            manifest.snapshot_id,
            manifest.generation,
            self.snapshot_topic,
            self.partition,
            offset,
            why,
        )

    def _refuse_truncated(self, manifest: Manifest | None) -> None:
        raise truncated(self.topic, self.partition, self.changelog_start, manifest, self.skipped)

    # -- the changelog tail ----------------------------------------------------------------------------------------
    def close(self) -> None:
        self._drop_prefetch()
        # Never while the metadata warm-up uses the consumer: it closes it as it ends, off the loop's thread.
        consumer = self._consumer
        self._warmed.add_done_callback(lambda _: consumer.close())

    def _prefetch(self, start: int) -> None:
        """Starts fetching the changelog tail that follows this snapshot while its chunks load."""
        self._drop_prefetch()
        if start >= self.end:
            return
        self._tail_consumer = self._make_consumer()
        self._tail_start = start
        self._tail_reader = TailReader(
            CheckedConsumer(self._tail_consumer), self.topic, {self.partition: start}, {self.partition: self.end}
        )

    def _drop_prefetch(self) -> None:
        if self._tail_consumer is not None:
            if self._reader is self._tail_reader:
                self._reader = None
            self._tail_consumer.close()
        self._tail_consumer = self._tail_reader = None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> str:
        """For the log line of a finished restore."""
        source = self.snapshot.snapshot_id if self.snapshot else "no snapshot"
        if self.standby_keys is not None:
            source = f"a standby copy of {self.standby_keys} keys"
        return (
            f"p{self.partition} restored: {len(self.state)} keys from {self.snapshot_entries} snapshot entries "
            f"({source}) and {self.records} changelog records in {self.seconds:.2f}s"
        )

    def _apply(self, messages: list[Consumed]) -> None:
        if messages:
            if (checkpoint := apply_changelog(self.state, messages)) is not None:
                self.last_checkpoint = checkpoint
            self.records += len(messages)

    def _progress(self) -> None:
        if time.monotonic() <= self._next_progress:
            return
        self._next_progress += PROGRESS_EVERY_S
        if self.phase is RestorePhase.TAIL and self._reader is not None:
            log.info(
                "restoring p%d: %d snapshot entries, %d changelog records, position %d of %d",
                self.partition,
                self.snapshot_entries,
                self.records,
                self._reader.positions[self.partition],
                self.end,
            )
        elif self.phase is RestorePhase.OFFSETS:
            log.info("restoring p%d: waiting for the broker: %s", self.partition, self._bounds.stuck())
        else:
            log.info(
                "restoring p%d: %s, %d snapshot records read",
                self.partition,
                "looking for the latest snapshot" if self.phase is RestorePhase.SCAN else "loading the snapshot",
                self.snapshot_records + (self._load.records if self._load else 0),
            )

    @property
    def progress(self) -> tuple[int, str, int, int]:
        """Changes with every record read (the stall watchdog, pipeline/core/stall.py: a restore that moves is no
        stall, however long it takes)."""
        load = self._load.records if self._load is not None else 0
        return (self.restarts, self.phase.value, self.records, self.snapshot_records + load)

    def stuck(self) -> str:
        """Where the restore stands and what it waits for."""
        return f"restore in phase {self.phase.value}, {self.records} changelog records read: {self._stuck()}"

    def _stuck(self) -> str:
        if self.phase is RestorePhase.OFFSETS:
            return self._bounds.stuck()
        if self.phase is RestorePhase.SCAN and self._scan is not None:
            return f"{self.snapshot_topic}: {self._scan.stuck()}"
        if self.phase is RestorePhase.LOAD and self._load is not None:
            return f"{self.snapshot_topic}: loading chunks of {self._load.manifest.snapshot_id}"
        return f"{self.topic}: {self._reader.stuck() if self._reader is not None else 'no read pending'}"

    def _verify_checkpoint(self) -> None:
        verify_checkpoint(self.partition, self.last_checkpoint, self.snapshot, self.committed_offset, self.strict)
