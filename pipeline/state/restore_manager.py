"""Every restore of one runner, as Kafka Streams' StoreChangelogReader or Quix's RecoveryManager: started when p is
assigned (after the fence), stepped between polls within one budget (docs/guarantees.md: restore-keeps-membership),
started again after broker trouble (bounded by RESTORE_TIMEOUT_MS), forgotten when p is revoked. One partition's
restore is pipeline/state/restore.py's ChangelogRestore."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline.app import Table
from pipeline.kafka.offsets import EndOffsetsTimeout
from pipeline.serde import Serde
from pipeline.settings import Settings
from pipeline.state import PartitionState
from pipeline.state.local_stores import LocalStores
from pipeline.state.restore import ChangelogRestore, RestoreError, StandbyCopy
from pipeline.state.table_restore import TableRestore

log = logging.getLogger(__name__)


class RestoreManager:
    """Every restore of one runner. The runner starts p's restore when p is assigned (after the fence), steps all
    of them between polls, takes the finished ones (state, snapshot, changelog end) and forgets p when it goes."""

    def __init__(
        self,
        settings: Settings,
        changelog_topic: str,
        snapshot_topic: str | None,
        state_serde: Serde,
        make_consumer: Callable[[], Consumer],
        make_admin: Callable[[], AdminClient],
        admin: AdminClient,
        tables: Mapping[str, Table] | None = None,
        local_stores: LocalStores | None = None,
    ) -> None:
        self._local = local_stores  # STATE_STORE=disk: restores go into p's store on disk, starting from what it holds
        self._changelog_topic, self._snapshot_topic, self._state_serde = changelog_topic, snapshot_topic, state_serde
        self._make_consumer, self._make_admin, self._admin = make_consumer, make_admin, admin
        self._timeout_s = settings.restore_timeout_ms / 1000
        self._request_timeout_s = settings.request_timeout_ms / 1000
        self._step_s = settings.restore_step_ms / 1000
        self._strict = settings.exactly_once
        # Every partition being restored: the committed offset to match (of every input, for several).
        self._committed: dict[int, int | Mapping[str, int | None] | None] = {}
        self._running: dict[int, ChangelogRestore] = {}
        self._retry_at: dict[int, float] = {}  # after broker trouble: when to start again
        self._failing_since: dict[int, float] = {}
        self._table_specs = dict(tables or {})  # co-partitioned tables: restored from their own topics
        self._tables: dict[int, TableRestore] = {}
        self._changelog_done: set[int] = set()

    @property
    def busy(self) -> bool:
        return bool(self._committed)

    def running(self) -> dict[int, ChangelogRestore]:
        return dict(self._running)

    def start(
        self, p: int, committed_offset: int | Mapping[str, int | None] | None, copy: StandbyCopy | None = None
    ) -> None:
        """Starts restoring p's state, which must come out covering the group's committed offset of p; from p's
        standby copy if there is one (pipeline/state/standby.py)."""
        self._committed[p] = committed_offset
        self._open(p, copy)

    def warm_up(self, p: int) -> ChangelogRestore:
        """A standby copy's first restore: the same steps, no committed offset to match (pipeline/state/standby.py).
        STATE_STORE=disk: into p's store, from what it holds (a copy or p's own state of an earlier life here)."""
        if self._local is not None:
            state, base = self._local.base(p, self._state_serde)
            return self._restore(p, state, None, copy=base, verify=False)
        return self._restore(p, PartitionState(self._state_serde), None, verify=False)

    def step(self) -> list[ChangelogRestore]:
        """Works on every restore for about RESTORE_STEP_MS in all (docs/guarantees.md: restore-keeps-membership);
        returns the ones that finished, forgotten here. Raises RestoreError if a state cannot be complete."""
        now = time.monotonic()
        for p, retry_at in list(self._retry_at.items()):
            if now >= retry_at:
                del self._retry_at[p]
                self._open(p)
        if not self._running:
            return []
        budget, finished = self._step_s / len(self._running), []
        for p, restore in list(self._running.items()):
            try:
                done = self._step(p, restore, budget)
            except RestoreError:
                self.forget(p)
                raise
            except EndOffsetsTimeout as e:
                self._drop_running(p)
                self._later(p, e)
                continue
            if done:
                restore.tables = self._tables.pop(p, None)
                self.forget(p)
                finished.append(restore)
        return finished

    def _step(self, p: int, restore: ChangelogRestore, budget_s: float) -> bool:
        """The changelog first, then the co-partitioned tables; True once both are complete."""
        if p not in self._changelog_done:
            if not restore.step(budget_s):
                return False
            self._changelog_done.add(p)
            if self._table_specs:
                self._tables[p] = TableRestore(
                    self._make_consumer, self._admin, self._table_specs, p, self._request_timeout_s, self._timeout_s
                )
        tables = self._tables.get(p)
        return tables is None or tables.step(budget_s)

    def _drop_running(self, p: int) -> None:
        self._running.pop(p).close()
        self._changelog_done.discard(p)
        if (tables := self._tables.pop(p, None)) is not None:
            tables.close()

    def progress(self, p: int) -> object:
        """Changes with every step of p's restore that read something (the stall watchdog)."""
        restore, tables = self._running.get(p), self._tables.get(p)
        return (
            restore.progress if restore is not None else None,
            tables.records if tables is not None else None,
            self._retry_at.get(p),
        )

    def stuck(self, p: int) -> str:
        """What p's restore waits for, for the stall WARNING."""
        if (tables := self._tables.get(p)) is not None:
            return f"restoring its tables: {tables.stuck()}"
        if (restore := self._running.get(p)) is not None:
            return restore.stuck()
        if p in self._retry_at:
            left = max(0.0, self._retry_at[p] - time.monotonic())
            return f"restore to start again in {left:.1f} s after broker trouble"
        return "no restore of p running"

    def forget(self, p: int) -> None:
        if (restore := self._running.pop(p, None)) is not None:
            restore.close()
        if (tables := self._tables.pop(p, None)) is not None:
            tables.close()
        self._changelog_done.discard(p)
        for table in (self._committed, self._retry_at, self._failing_since):
            table.pop(p, None)

    def _open(self, p: int, copy: StandbyCopy | None = None) -> None:
        """The first try may start from p's standby copy; a try after broker trouble starts from nothing again."""
        state: PartitionState
        if copy is None and self._local is not None:
            state, copy = self._local.base(p, self._state_serde)
        else:
            state = copy.state if copy is not None else PartitionState(self._state_serde)
        try:
            self._running[p] = self._restore(p, state, self._committed[p], copy=copy)
        except EndOffsetsTimeout as e:
            self._later(p, e)

    def _restore(
        self,
        p: int,
        state: PartitionState,
        committed: int | Mapping[str, int | None] | None,
        copy: StandbyCopy | None = None,
        verify: bool = True,
    ) -> ChangelogRestore:
        return ChangelogRestore(
            self._make_consumer,
            self._admin,
            self._changelog_topic,
            p,
            state,
            committed,
            self._timeout_s,
            self._request_timeout_s,
            strict=self._strict,
            snapshot_topic=self._snapshot_topic,
            base=copy,
            verify=verify,
        )

    def _later(self, p: int, error: Exception) -> None:
        """Broker trouble (leaders moving, a broker down) is not a missing state: retry, within RESTORE_TIMEOUT_MS."""
        now = time.monotonic()
        failing_since = self._failing_since.setdefault(p, now)
        if now - failing_since > self._timeout_s:
            raise RestoreError(f"p{p}: restore kept failing for {now - failing_since:.0f}s: {error}") from error
        log.warning("p%d: restore cannot go on yet (%s); starting it again in 1 s", p, error)
        self._retry_at[p] = now + 1.0
        self._admin = self._make_admin()  # librdkafka may keep stale leader epochs
