"""Every disk state store of one process (STATE_STORE=disk): STATE_DIR locked for this process alone, one RocksDB per
input partition under STATE_DIR/<app id>/p<partition>, and what a restore of p starts from.

A store found on the disk is trusted only as far as it says: its recorded changelog offset (the local checkpoint, see
disk_store.py) becomes the base of p's restore as a standby copy does, and the restore (pipeline/state/restore.py)
decides after the fence: the tail from that offset to the changelog's end is read (what this process wrote after it,
or what other members wrote since it left p), and the last checkpoint must name the group's committed offset of p.
A store whose offset the changelog no longer holds (compacted or deleted past it, or the topic recreated), or whose
checkpoint does not match, is wiped and p restored in full (snapshot + tail) into it; so is one that RocksDB cannot
open (corrupted or truncated files) or that records no offset (a restore that never finished).

The stores found on the disk at start-up (the 16 most recently written) are opened on threads of their own at once,
while the process checks its topics, fences and joins the group: a restarted process's partitions are then open
when they are assigned (tools/bench/disk_state.py restart: BENCHMARKS.md).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Gauge

from pipeline.app import App
from pipeline.serde import Serde
from pipeline.settings import ConfigError, Settings
from pipeline.state.disk_store import DiskPartitionState, DiskStore, StoreMemory
from pipeline.state.restore_setup import StandbyCopy

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"
OPEN_AHEAD_AT_MOST = 16  # stores opened while the process starts: the most recently written (a restart's own)


class LocalStores:
    def __init__(self, settings: Settings, app_id: str, registry: CollectorRegistry | None = None) -> None:
        self.root = Path(settings.state_dir)
        self.directory = self.root / app_id
        self._lock = lock_directory(self.root)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.memory = StoreMemory(settings.state_block_cache_mb, settings.state_write_buffer_mb)
        self.stores: dict[int, DiskStore] = {}
        self._kill_at = settings.test_kill_before_state_write
        self._gauges = StoreGauges(registry or CollectorRegistry(), self.root)
        self._opening = self._open_ahead()

    def _open_ahead(self) -> dict[int, Future[DiskStore]]:
        """The stores found on this disk, the most recently written first, opened on threads of their own while the
        process starts: the topic checks, the fence and the group join wait on the network meanwhile, and a restarted
        process's own partitions are open when they are assigned (each open replays RocksDB's log after a SIGKILL:
        ~0.07 s, one after the other at the assignment before)."""
        found = [path for path in self.directory.glob("p*") if path.name[1:].isdigit() and path.is_dir()]
        recent = sorted(found, key=lambda path: path.stat().st_mtime, reverse=True)[:OPEN_AHEAD_AT_MOST]
        if not recent:
            return {}
        pool = ThreadPoolExecutor(len(recent), thread_name_prefix="open-store")
        opening = {int(path.name[1:]): pool.submit(self._open, path) for path in recent}
        pool.shutdown(wait=False)  # the threads end with their open
        return opening

    def store(self, p: int) -> DiskStore:
        """p's store, opened once per process (kept open when p leaves: it may come back); opened ahead if it was
        on the disk at start-up (its open's error, if any, raised here as it would be without)."""
        store = self.stores.get(p)
        if store is None:
            opening = self._opening.pop(p, None)
            store = opening.result() if opening is not None else self._open(self.directory / f"p{p}")
            self.stores[p] = store
        return store

    def _open(self, path: Path) -> DiskStore:
        store = self._open_or_wipe(path)
        store.observer = self._gauges.observe
        return store

    def _open_or_wipe(self, path: Path) -> DiskStore:
        try:
            return DiskStore(path, self.memory, self._kill_at)
        except Exception as e:  # rocksdict raises a bare Exception: Corruption, IO error (a file missing), ...
            log.warning("the state store in %s cannot be opened (%s): wiped; p is restored in full", path, e)
            shutil.rmtree(path, ignore_errors=True)
            return DiskStore(path, self.memory, self._kill_at)

    def base(self, p: int, serde: Serde) -> tuple[DiskPartitionState, StandbyCopy | None]:
        """What p's restore starts from: its store, and the store as a copy to read the tail after if it records the
        changelog offset it covers; otherwise the store wiped, for a full restore."""
        store = self.store(p)
        state = DiskPartitionState(store, serde)
        if store.position is None:
            if store.count:
                log.warning("p%d: the state store in %s records no changelog offset: wiped", p, store.path)
            store.wipe()
            return state, None
        log.info("p%d: local state store in %s: %d keys, changelog < %d", p, store.path, store.count, store.position)
        return state, StandbyCopy(p, state, store.position, store.snapshot, store.checkpoint)

    def close(self) -> None:
        for p, opening in list(self._opening.items()):  # opened ahead, never asked for: closed too
            if opening.exception() is None:
                self.stores.setdefault(p, opening.result())
        self._opening.clear()
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self._lock.close()


class StoreGauges:
    """The disk stores' Prometheus metrics, per partition, set after each of its writes."""

    def __init__(self, registry: CollectorRegistry, root: Path) -> None:
        self.root = root
        labels = ["partition"]
        self.disk = Gauge(
            "pipeline_state_disk_bytes",
            "Disk taken by a partition's state store (STATE_STORE=disk)",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.keys = Gauge(
            "pipeline_state_keys",
            "Keys in a partition's disk state store",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.checkpoint = Gauge(
            "pipeline_state_local_checkpoint",
            "The changelog offset a partition's disk state store covers up to (-1: none; a restart reads from it)",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.free = Gauge(
            "pipeline_state_disk_free_bytes",
            "Free space where STATE_DIR is",
            registry=registry,
            multiprocess_mode="liveall",
        )

    def observe(self, store: DiskStore) -> None:
        label = store.path.name.removeprefix("p")
        self.disk.labels(label).set(store.disk_bytes())
        self.keys.labels(label).set(store.count)
        self.checkpoint.labels(label).set(-1 if store.position is None else store.position)
        self.free.set(shutil.disk_usage(self.root).free)


def local_stores(
    app: App, settings: Settings, app_id: str, registry: CollectorRegistry | None = None
) -> LocalStores | None:
    """The process's disk stores with STATE_STORE=disk (a stateful App); None otherwise."""
    if settings.state_store != "disk" or not app.stateful:
        return None
    return LocalStores(settings, app_id, registry)


def lock_directory(root: Path) -> IO[str]:
    """One process per state directory: an exclusive lock on STATE_DIR/.lock, held while the process runs (the OS
    drops it when the process dies, however it dies)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / LOCK_FILE, "w")  # noqa: SIM115 (held open for the process's life)
    except OSError as e:
        raise ConfigError(f"STATE_DIR={root} cannot be used: {e}") from e
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(
            f"STATE_DIR={root} is in use by another process (lock {root / LOCK_FILE}): one process per state "
            "directory; give each process its own"
        ) from None
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock
