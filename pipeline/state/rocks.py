"""RocksDB for the disk state store (pipeline/state/disk_store.py): one partition's database with its bookkeeping
(the changelog offset it covers, its last checkpoint, the snapshot it folds, its key count) in a column family of
its own, written in the same atomic batches as the state; and the memory every store of a process shares."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from pipeline.settings import ConfigError
from pipeline.state.changelog import Checkpoint
from pipeline.state.snapshot_format import Manifest

if TYPE_CHECKING:
    import rocksdict

log = logging.getLogger(__name__)
META = "meta"  # the column family of the store's own bookkeeping; the default one holds the state's keys
POSITION, CHECKPOINT, SNAPSHOT, COUNT = b"position", b"checkpoint", b"snapshot", b"count"
LOAD_BATCH = 50_000  # entries per write batch of a restore


def engine() -> ModuleType:
    """rocksdict, imported only when a disk store is used: it is the optional extra [disk]."""
    try:
        import rocksdict
    except ImportError as e:
        raise ConfigError(
            "STATE_STORE=disk needs RocksDB: install the [disk] extra (pip install 'eos-pipeline[disk]')"
        ) from e
    return rocksdict


class StoreFull(OSError):
    """A write to the disk store failed (no space left, or the disk itself): p stops, naming the directory."""

    fix = (
        "Free space in STATE_DIR (or give it a larger volume) and restart: the disk store is behind the last commit, "
        "and the restart reads the rest from the changelog"
    )


class StoreMemory:
    """What every disk store of a process shares, so that memory stays bounded whatever the number of keys and
    partitions: one block cache and one write-buffer budget (charged to the cache)."""

    def __init__(self, block_cache_mb: int, write_buffer_mb: int) -> None:
        rocksdict = engine()
        self.cache = rocksdict.Cache(block_cache_mb << 20)
        self.buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            write_buffer_mb << 20, False, self.cache
        )
        self.write_buffer_bytes = write_buffer_mb << 20

    def options(self) -> rocksdict.Options:
        rocks = engine()
        options: rocksdict.Options = rocks.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        table = rocks.BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_bloom_filter(10, False)  # a point read of a key never written skips the files that lack it
        table.set_cache_index_and_filter_blocks(True)  # indexes and filters inside the cache's bound as well
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(self.buffers)
        options.set_write_buffer_size(min(64 << 20, max(1 << 20, self.write_buffer_bytes // 2)))
        options.set_max_write_buffer_number(2)
        options.set_max_open_files(256)
        options.set_keep_log_file_num(2)
        return options


class DiskStore:
    """One partition's RocksDB and its bookkeeping (position, last checkpoint, the snapshot it folds, key count)."""

    def __init__(self, path: Path, memory: StoreMemory, kill_at: int = 0) -> None:
        self.path, self._memory = path, memory
        self.observer: Callable[[DiskStore], None] = lambda store: None  # after each write: the metrics
        self.kill_at = kill_at  # TEST_KILL_BEFORE_STATE_WRITE
        self.lock = threading.Lock()  # the committing batch against the readers of another thread
        self.committing: Mapping[str, bytes | None] = {}
        self._open()

    def _open(self) -> None:
        options = self._memory.options()
        self.db = engine().Rdict(str(self.path), options, column_families={META: self._memory.options()})
        self._meta_handle = self.db.get_column_family_handle(META)
        meta = self.db.get_column_family(META)
        raw_position, raw_count = meta.get(POSITION), meta.get(COUNT)
        raw_checkpoint, raw_snapshot = meta.get(CHECKPOINT), meta.get(SNAPSHOT)
        meta.close()  # a column family's view holds the database open (its lock too) until it is closed
        self.position: int | None = None if raw_position is None else int(raw_position)
        self.count = 0 if raw_count is None else int(raw_count)
        self.checkpoint = None if raw_checkpoint is None else Checkpoint.decode(raw_checkpoint)
        self.snapshot = None if not raw_snapshot else Manifest.decode(raw_snapshot)

    # -- reads -----------------------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return cast(bytes | None, self.db.get(key.encode()))

    def keys(self) -> Iterator[str]:
        return (key.decode() for key in self.db.keys())  # noqa: SIM118 (an Rdict's keys, not a dict's)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return ((key.decode(), value) for key, value in self.db.items())

    def prefixed(self, prefix: str, limit: int | None = None) -> list[tuple[str, bytes]]:
        """Every (key, value) whose key starts with prefix, in key order (at most limit)."""
        start, found = prefix.encode(), list[tuple[str, bytes]]()
        for key, value in self.db.items(from_key=start):
            if not key.startswith(start) or (limit is not None and len(found) >= limit):
                break
            found.append((key.decode(), value))
        return found

    # -- writes ----------------------------------------------------------------------------------------------------
    def write(
        self,
        entries: Mapping[str, bytes | None],
        count: int,
        position: int | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """entries (None: delete) and the key count, with the local checkpoint if given, in one atomic batch."""
        batch = engine().WriteBatch(raw_mode=True)
        for key, value in entries.items():
            if value is None:
                batch.delete(key.encode())
            else:
                batch.put(key.encode(), value)
        batch.put(COUNT, b"%d" % count, self._meta_handle)
        if position is not None:
            batch.put(POSITION, b"%d" % position, self._meta_handle)
            if checkpoint is not None:
                batch.put(CHECKPOINT, checkpoint.encode(), self._meta_handle)
        self._write(batch)
        self.count = count
        if position is not None:
            self.position, self.checkpoint = position, checkpoint or self.checkpoint
        self.observer(self)

    def mark(self, position: int, checkpoint: Checkpoint | None, snapshot: Manifest | None) -> None:
        """A restore ended: the data covers the changelog below `position` (restore's end), folded from `snapshot`."""
        batch = engine().WriteBatch(raw_mode=True)
        batch.put(POSITION, b"%d" % position, self._meta_handle)
        if checkpoint is None:
            batch.delete(CHECKPOINT, self._meta_handle)
        else:
            batch.put(CHECKPOINT, checkpoint.encode(), self._meta_handle)
        batch.put(SNAPSHOT, b"" if snapshot is None else snapshot.encode(), self._meta_handle)
        self._write(batch)
        self.position, self.checkpoint, self.snapshot = position, checkpoint, snapshot
        self.observer(self)

    def _write(self, batch: rocksdict.WriteBatch) -> None:
        try:
            self.db.write(batch)
        except Exception as e:  # rocksdict raises a bare Exception with RocksDB's message ("IO error: No space...")
            raise StoreFull(f"the disk state store in {self.path} cannot be written: {e}") from e

    def wipe(self) -> None:
        """Deletes everything, bookkeeping included: the store is empty and covers nothing."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()
        self.observer(self)

    def close(self) -> None:
        del self._meta_handle  # holds the database open as a column family's view does
        self.db.close()

    def disk_bytes(self) -> int:
        """The store's files (tables, write-ahead log, manifest): what it takes on disk."""
        try:
            return sum(entry.stat().st_size for entry in os.scandir(self.path) if entry.is_file())
        except FileNotFoundError:  # wiped under the look
            return 0
