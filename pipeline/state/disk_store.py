"""The disk state store (STATE_STORE=disk): one input partition's state in RocksDB on local disk (rocksdict), with the
same `State` contract as the in-memory PartitionState (docs/guarantees.md: disk-state).

As Kafka Streams' KIP-892, the open transaction never reaches the disk:

    PendingWrites   the partition's `_data`: the open transaction's writes in a dict (None: deleted), every read
                    through them to RocksDB. PartitionState's undo logs work on it unchanged (an undo writes the old
                    value back into the dict); an aborted transaction's dict is simply dropped.
    commit          after the sink's commit (the Kafka transaction), the dict goes to RocksDB in ONE atomic write batch,
                    with, in the same batch, the changelog offset the state now covers (the local checkpoint), the
                    last checkpoint record and the key count. A crash before that batch leaves the disk at the
                    previous commit: the changelog has the rest.
    restart         (pipeline/state/local_stores.py) a store whose recorded changelog offset the changelog still holds
                    is the base of p's restore, as a standby copy is: only the changelog after it is read, and the
                    last checkpoint is verified against the group's committed offset as for any restore.

Why the local checkpoint may lag the data but never lead it: replaying the changelog from an offset at or below the
one the data covers ends in the same state (last write per key wins, and every key written in between is written
again by the replay). So a restore's writes go straight to the disk without moving it, and the offset is recorded
only where it is known exactly: at the end of a restore and after a commit whose checkpoint's offset the producer
reported.

Reads from another thread (interactive queries): `committed_get` and `committed_range` see the last committed
transaction: RocksDB plus the batch being written, never the open dict.

State versions (pipeline/state/versions.py): RocksDB holds each value as the changelog does, tagged with the version
that wrote it (version 1: no tag), so a restore, a standby copy and a restart load changelog and snapshot entries as
they are, and a snapshot is the store's entries as they are. The open dict holds the current version's bytes, as the
memory store does; a read from the disk above version 1 (`StoredVersions`) takes the tag off and migrates an older
value, every time it is read until the key is written again (a restart never rewrites 100 M keys). Version 1 reads
the disk's bytes with no check at all. A state newer than the code refuses at the restore from one reserved entry,
`__eos.state_version`, which every commit at a version above 1 writes (no scan of the keys).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from pipeline.app import App, CodeError, Migrate
from pipeline.serde import Serde
from pipeline.state.changelog import Checkpoint
from pipeline.state.rocks import LOAD_BATCH, DiskStore, StoreFull, StoreMemory
from pipeline.state.store import PartitionState
from pipeline.state.timed import (
    RESERVED,
    TIMER_PREFIXES,
    TTL_PREFIX,
    TimedState,
    WallTtlState,
    restored_state,
    wall_clock_ms,
)
from pipeline.state.versions import current_value, refuse_newer, tag

log = logging.getLogger(__name__)


class StoredVersions:
    """Between stored values and a state at version > 1 (the module's docstring): values leave tagged with the
    version, come back at the current one. Reserved keys (timers, TTL, the version itself) are never tagged. The disk
    store's reads go through it, and so do a standby copy's committed reads (pipeline/state/restore_setup.py)."""

    def __init__(self, version: int, serde: Serde, migrate: Migrate | None) -> None:
        self.version, self.serde, self.migrate = version, serde, migrate
        self.own_tag = tag(version, b"")

    def get(self, store: DiskStore, key: str) -> bytes | None:
        """A read through to the disk: the value at the current version."""
        stored = store.get(key)
        return stored if stored is None else self.current(key, stored)

    def current(self, key: str, stored: bytes) -> bytes:
        if key.startswith(RESERVED):
            return stored
        if stored.startswith(self.own_tag):
            return stored[len(self.own_tag) :]
        try:
            return current_value(stored, self.version, self.serde, self.migrate, key)
        except Exception as e:  # met by `process` (or on_timer): p stops at once, as the memory store's restore does
            raise CodeError(
                "migrate",
                f"cannot read state key {key!r} at state version {self.version}: {type(e).__name__}: {e}",
                "make migrate(version, value) return the value at the App's state_version for every older version",
            ) from e

    def stored(self, pending: Mapping[str, bytes | None]) -> dict[str, bytes | None]:
        """A transaction's writes as the disk keeps them: tagged with the current version."""
        own = self.own_tag
        return {
            key: value if value is None or key.startswith(RESERVED) else own + value for key, value in pending.items()
        }


class PendingWrites:
    """`_data` of a disk-backed state: the open transaction's writes (None: deleted) over the store. The subset of a
    dict's methods that PartitionState and TimedState use."""

    def __init__(self, store: DiskStore, versions: StoredVersions | None = None) -> None:
        self.store = store
        # A read of the disk: its bytes as they are (version 1), or at the current version (StoredVersions).
        self.fetch = store.get if versions is None else functools.partial(versions.get, store)
        self.pending: dict[str, bytes | None] = {}
        # The disk's values read in this transaction: `process` reading a key and then writing it reads it twice
        # (the undo log remembers the value before), and a RocksDB read costs more than the rest of the record.
        self.read: dict[str, bytes | None] = {}

    def reset(self) -> None:
        """The transaction is over (written, or dropped): nothing held any more."""
        self.pending = {}
        self.read = {}

    def get(self, key: str, default: Any = None) -> Any:
        pending = self.pending
        if key in pending:
            value = pending[key]
            return default if value is None else value
        read = self.read
        if key in read:
            value = read[key]
        else:
            value = read[key] = self.fetch(key)
        return default if value is None else value

    def __getitem__(self, key: str) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return cast(bytes, value)

    def __setitem__(self, key: str, value: bytes) -> None:
        self.pending[key] = value

    def __delitem__(self, key: str) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.pending[key] = None

    def pop(self, key: str, default: Any = None) -> Any:
        value = self.get(key, default)
        self.pending[key] = None
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        pending = dict(self.pending)  # a copy: the caller may write while iterating (the dict would refuse)
        for key in self.store.keys():  # noqa: SIM118 (a DiskStore, not a dict)
            if pending.get(key, b"") is not None:
                yield key
        for key, value in pending.items():
            if value is not None and self.store.get(key) is None:
                yield key

    def items(self) -> Iterator[tuple[str, bytes]]:
        return ((key, self[key]) for key in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class DiskBacked(PartitionState):
    """What makes a PartitionState (or a TimedState, by multiple inheritance) keep its committed state on disk."""

    _data: PendingWrites  # type: ignore[assignment]
    version: int = 1  # a TimedState's own (an App's state_version); a plain state is at version 1
    migrate: Migrate | None = None

    def attach(self, store: DiskStore) -> None:
        version = self.version
        self.versions = None if version == 1 else StoredVersions(version, self._serde, self.migrate)
        self._data = PendingWrites(store, self.versions)
        self.store = store
        self.failed: StoreFull | None = None  # a disk batch that failed: p stops at its next record
        self.position: int | None = None  # the changelog offset the next commit reaches, if the sink told it
        self.checkpoint: Checkpoint | None = None

    def reached(self, txn: int, delivered: tuple[int, int, Checkpoint] | None) -> None:
        """Before commit(): the sink committed its transaction number `txn`; `delivered` is (transaction number,
        changelog offset, checkpoint) of the last checkpoint record the producer reported. The
        local checkpoint moves to just past it only if it is this transaction's; otherwise it stays where it was,
        which is safe (the module's docstring)."""
        known = delivered is not None and delivered[0] == txn
        self.position = delivered[1] + 1 if known and delivered is not None else None
        self.checkpoint = delivered[2] if known and delivered is not None else None
        if self.store.kill_at and txn >= self.store.kill_at:  # testing: a crash between the sink's commit and the disk
            log.warning("TEST_KILL_BEFORE_STATE_WRITE: SIGKILL after the sink's commit, before the disk batch")
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(self) -> None:
        """After the sink's commit: the transaction's writes to the disk, in one batch with the local checkpoint. A
        batch the disk refuses (full) is dropped: the disk stays at the last commit it took, which is safe (the
        changelog has the rest), and p stops at its next record (`begin_record` raises StoreFull, naming the
        directory): never a state that runs on in memory only."""
        store, pending = self.store, self._data.pending
        try:
            if self.failed is not None:
                pass  # stopping: nothing more reaches the disk
            elif pending:
                self._write(pending)
            elif self.position is not None and self.position != store.position:
                store.write({}, store.count, self.position, self.checkpoint)
        except StoreFull as e:
            log.error("%s", e)
            self.failed = e
        self._data.reset()
        self.position = self.checkpoint = None
        super().commit()
        if self.failed is not None:
            self.begin_record = self._refuse  # type: ignore[method-assign]  # no cost on the hot path until then

    def _write(self, pending: dict[str, bytes | None]) -> None:
        store = self.store
        count = store.count + self._count_change()
        batch = pending if self.versions is None else self.versions.stored(pending)
        with store.lock:
            store.committing = batch
        try:
            store.write(batch, count, self.position, self.checkpoint)
        finally:
            with store.lock:
                store.committing = {}

    def _refuse(self) -> None:
        raise StoreFull(str(self.failed)) from self.failed

    def _count_change(self) -> int:
        """Keys the open transaction adds minus those it deletes: from the undo log's values before it."""
        missing = object()
        change, pending = 0, self._data.pending
        for key, before in self._before_txn.items():
            now = pending.get(key, missing)
            if now is missing:
                continue
            change += (now is not None) - (isinstance(before, bytes))
        return change

    def undo_transaction(self) -> None:
        super().undo_transaction()
        self._data.reset()  # the undo wrote the old values back into the dict: they are the disk's anyway

    def __len__(self) -> int:
        if not self._before_txn:
            return self.store.count
        return self.store.count + self._count_change()

    def load(self, entries: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]) -> None:
        """Restore: straight to the disk, in batches (no transaction open)."""
        batch: dict[str, bytes | None] = {}
        for key, value in entries.items() if isinstance(entries, Mapping) else entries:
            batch[key] = value
            if len(batch) >= LOAD_BATCH:
                self._load_batch(batch)
                batch = {}
        if batch:
            self._load_batch(batch)
        self._data.reset()

    def load_at(self, entries: Mapping[str, bytes | None], position: int, checkpoint: Checkpoint | None) -> None:
        """A standby copy's followed changes (pipeline/state/standby.py) with the changelog offset they reach and the
        last checkpoint among them, in ONE atomic batch: whenever the process dies, the store's data is at its recorded
        offset or past it (a restore's writes), never behind it."""
        self._load_batch(entries, position, checkpoint)
        self._data.reset()

    def _load_batch(
        self, batch: Mapping[str, bytes | None], position: int | None = None, checkpoint: Checkpoint | None = None
    ) -> None:
        store = self.store
        if store.count:  # which of these keys the store holds already: one multi-get
            had = store.db.get([key.encode() for key in batch])
            pairs = zip(batch.values(), had, strict=True)
            change = sum((value is not None) - (old is not None) for value, old in pairs)
        else:
            change = sum(value is not None for value in batch.values())
        store.write(batch, store.count + change, position, checkpoint)

    def encoded_items(self) -> Iterable[tuple[str, bytes]]:
        """The entries as the disk keeps them (each tagged with the version that wrote it, as the changelog's): a
        snapshot's restore migrates them as it does the changelog's. Nothing held (a snapshot on shutdown, after the
        last commit): one pass of RocksDB's iterator, as it is."""
        pending = self._data.pending
        if not pending:
            return self.store.items()
        return self._with_pending(pending if self.versions is None else self.versions.stored(pending))

    def _with_pending(self, stored: Mapping[str, bytes | None]) -> Iterator[tuple[str, bytes]]:
        store = self.store
        for key, value in store.items():
            now = stored.get(key, value)
            if now is not None:
                yield key, now
        for key, new in stored.items():
            if new is not None and store.get(key) is None:
                yield key, new

    def clear_all(self) -> None:
        """A restore starts over from nothing."""
        self.store.wipe()
        self._data.reset()

    # -- interactive queries: another thread, the committed state only -------------------------------------------
    # Both read what the disk keeps (RocksDB, the batch being written) and give it at the current version.
    def committed_get(self, key: str) -> bytes | None:
        store = self.store
        with store.lock:
            committing = store.committing
        value = committing[key] if key in committing else store.get(key)
        return value if value is None or self.versions is None else self.versions.current(key, value)

    def committed_range(self, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        store = self.store
        with store.lock:
            committing = dict(store.committing)
        found = dict(store.prefixed(prefix, limit + len(committing)))
        for key, value in committing.items():
            if key.startswith(prefix):
                found[key] = value  # type: ignore[assignment]
        entries = sorted((k, v) for k, v in found.items() if v is not None)[:limit]
        versions = self.versions
        return entries if versions is None else [(k, versions.current(k, v)) for k, v in entries]


class DiskPartitionState(DiskBacked):
    def __init__(self, store: DiskStore, serde: Any) -> None:
        super().__init__(serde)
        self.attach(store)


class _DiskTimed(DiskBacked, TimedState):
    def __len__(self) -> int:
        return TimedState.__len__(self)  # the user's keys only, a scan (reserved keys are not counted apart)

    def load(self, entries: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]) -> None:
        DiskBacked.load(self, entries)
        self._reindex()

    def _reindex(self) -> None:
        """Stream time and the due queues from the reserved keys alone: a prefix scan, not a pass over every key."""
        self._queues = {clock: [] for clock in self._queues}
        self._queued = {}
        raw = self._data.get("__eos.stream_time")
        self.stream_time_ms = None if raw is None else int(raw)
        for prefix, clock in (*((p, c) for c, p in TIMER_PREFIXES.items()), (TTL_PREFIX, self.ttl_clock)):
            for entry, value in self.store.prefixed(prefix):
                if self._data.pending.get(entry, b"") is not None:
                    self._queues[clock].append((int(value.partition(b" ")[0]), entry))
        for queue in self._queues.values():
            queue.sort()


class DiskTimedState(_DiskTimed):
    pass


class DiskWallTtlState(_DiskTimed, WallTtlState):
    pass


def disk_failed(state: PartitionState) -> StoreFull | None:
    """The disk batch a disk store could not write (its partition must stop); None for any other state."""
    return state.failed if isinstance(state, DiskBacked) else None


def note_committed(state: PartitionState, txn: int, delivered: tuple[int, int, Checkpoint] | None) -> None:
    """The sink committed transaction number `txn` of a task (KafkaTask.committed): a disk store learns the changelog
    offset its batch reaches (DiskBacked.reached); a memory store has nothing to do."""
    if isinstance(state, DiskBacked):
        state.reached(txn, delivered)


def ready_state(app: App, restored: PartitionState, where: str, wall_clock: Any = wall_clock_ms) -> PartitionState:
    """timed.restored_state, and its disk counterpart for a disk store: the same store, under the class the App
    needs (timers, TTL)."""
    if not isinstance(restored, DiskBacked):
        return restored_state(app, restored, where, wall_clock)
    refuse_newer(cast(dict[str, bytes], restored._data), 1 if not app.extended_state else app.state_version, where)
    if not app.extended_state:
        return restored
    plain = TimedState.of(app, wall_clock)
    timed: _DiskTimed = (DiskWallTtlState if isinstance(plain, WallTtlState) else DiskTimedState)(app.state_serde)
    timed.__dict__.update({k: v for k, v in plain.__dict__.items() if k not in ("_timers",)})
    timed._timers = type(plain.timers)(timed)
    timed.attach(restored.store)
    timed._reindex()
    return timed


__all__ = ["RESERVED", "DiskBacked", "DiskPartitionState", "DiskStore", "StoreFull", "StoreMemory"]
