"""The life of one owned input partition in a runner: one Phase enum and one table of the moves between phases,
shared by both sinks (KafkaTask in the Kafka sink, PostgresTask in the PostgreSQL sink), as Kafka Streams' Task.State.

    NEW        -> RESTORING  start(): a stateful app restores p's state first (Kafka sink)
               -> RUNNING    start(): nothing to restore
               -> REWINDING  take_over() (PostgreSQL sink, all at once: tests and tools; the runner restores in steps)
    RESTORING  -> RUNNING    restored(): the state is complete
    RUNNING    -> REWINDING  abort_and_rewind(): the seek back to the committed offset is pending
               -> STOPPED    stop(): a poison record with on_poison=stop
               -> DROPPED    drop(): fenced, or a fatal producer error
    REWINDING  -> RUNNING    the seek took effect (try_seek_back(), positioned())
               -> STOPPED    a poison record's stop while the seek is still pending
               -> DROPPED    the producer it shared with other partitions broke (PRODUCERS=per_process)
    any other  -> CLOSED     close(): revoked, lost or shut down (Kafka sink)

Every move goes through `Lifecycle._transition`, which refuses one the table does not list (IllegalTransition):
a bug in a runner then fails loudly where it happens instead of, say, committing from a dropped partition.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    NEW = "new"  # created; for the Kafka sink: fenced (docs/guarantees.md: fence-first), not positioned yet
    RESTORING = "restoring"  # the state is being restored; p stays paused (docs/guarantees.md: complete-restore)
    RUNNING = "running"
    REWINDING = "rewinding"  # waiting for the seek back to the committed offset to take effect
    STOPPED = "stopped"  # a poison record with on_poison=stop: needs an operator
    DROPPED = "dropped"  # fenced or fatally broken producer: never commits again
    CLOSED = "closed"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.RESTORING, Phase.RUNNING, Phase.REWINDING, Phase.CLOSED}),
    Phase.RESTORING: frozenset({Phase.RUNNING, Phase.CLOSED}),
    Phase.RUNNING: frozenset({Phase.REWINDING, Phase.STOPPED, Phase.DROPPED, Phase.CLOSED}),
    # A seek that is still pending when the poison record's stop comes in: stopped all the same.
    # Dropped while a seek is pending: its producer broke under another partition (PRODUCERS=per_process).
    Phase.REWINDING: frozenset({Phase.RUNNING, Phase.STOPPED, Phase.DROPPED, Phase.CLOSED}),
    Phase.STOPPED: frozenset({Phase.CLOSED}),
    Phase.DROPPED: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}


def commit_deadline(opened_at: float, records: int, interval_ms: int, max_records: int) -> float:
    """COMMIT_INTERVAL_MS after the transaction (batch) opened, or at once when it holds COMMIT_MAX_RECORDS."""
    return opened_at + (0.0 if records >= max_records else interval_ms / 1000)


class IllegalTransition(RuntimeError):
    """A move between phases that the table does not allow: a bug in the runner, never a broker or data problem."""


class Lifecycle:
    """One owned input partition (a task or a worker) and its phase, changed only through `_transition` (or by
    assigning `phase`, which is the same check). `error` says why it stopped or was dropped."""

    partition: int
    next_offset: int | None  # the next input offset to process (None: from the beginning)

    def __init__(self) -> None:
        self._phase = Phase.NEW  # read directly only by the hot path, where a property call per record counts
        self.error: str | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

    @phase.setter
    def phase(self, to: Phase) -> None:
        """For tests and tools that put a partition into a phase; assigning the phase it is in changes nothing."""
        if to is not self._phase:
            self._transition(to)

    def _transition(self, to: Phase) -> None:
        if to not in TRANSITIONS[self._phase]:
            raise IllegalTransition(f"p{self.partition}: {self._phase.value} -> {to.value} is not a transition")
        self._phase = to

    def commit_deadline(self) -> float | None:
        """When the open transaction (or batch) is due for its commit, on time.monotonic()'s clock; None when nothing
        is open. The poll loop never waits past the earliest one."""
        return None

    def commit_due(self, now: float) -> bool:
        deadline = self.commit_deadline()
        return deadline is not None and now >= deadline

    def stop(self, error: str) -> None:
        """A poison record with on_poison=stop: nothing from it on is processed until an operator restarts."""
        self._transition(Phase.STOPPED)
        self.error = error
