"""What the poll loop has to attend to besides records, as the tasks report it: when the next commit is due, and
which partitions wait for a seek or a restore step. The loop used to ask every task each turn; at 384 partitions
that asking cost about 0.9 ms per turn (BENCHMARKS.md, "Backlog drain"), which at a few thousand records/s, where the
loop turns every few records, is most of a core. Told instead, a turn costs the same at 3 and at 384 partitions.

The tasks of one loop share one Schedule (their context carries it, pipeline/core/task.py tells it):
    opened(at)   a batch (transaction) opened at `at`                               Task.open_batch
    filled()     a batch holds COMMIT_MAX_RECORDS                                   Task.note_batch
    moved(task)  a task moved to another phase                                      Task._transition
and the loop asks:
    deadline()   when the next commit is due: COMMIT_INTERVAL_MS after the first batch opened since the last commit
                 round, or at once when one is full. Never later than any open batch's own deadline (the batch that
                 opened first is due first); earlier after a batch it counted was aborted, and then the commit round
                 only finds less to commit.
    restart()    a commit round takes every open batch (pipeline/core/loop.py: PollLoop._to_commit)
    waiting()    the owned tasks now in the given phases (REWINDING: a seek is pending; RESTORING)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TypeVar

from pipeline.core.lifecycle import Lifecycle, Phase, commit_deadline

# Phases a task leaves only through the loop's attention (a restore step, a seek retried). A task is created NEW and
# never moves back to it (a partition taken over again gets a new task); RUNNING needs records only; STOPPED, DROPPED
# and CLOSED are for good.
_WAITING = frozenset({Phase.RESTORING, Phase.REWINDING})
T = TypeVar("T", bound=Lifecycle)


class Schedule:
    def __init__(self, interval_ms: int, max_records: int) -> None:
        self._interval_ms = interval_ms
        self._max_records = max_records
        self._first_opened: float | None = None
        self._full = False
        self._waiting: set[Lifecycle] = set()

    # -- told by the tasks -------------------------------------------------------------------------------------------
    def opened(self, at: float) -> None:
        if self._first_opened is None or at < self._first_opened:
            self._first_opened = at

    def filled(self) -> None:
        self._full = True

    def moved(self, task: Lifecycle) -> None:
        if task.phase in _WAITING:
            self._waiting.add(task)

    # -- asked by the loop -------------------------------------------------------------------------------------------
    def deadline(self) -> float | None:
        if self._first_opened is None:
            return None
        records = self._max_records if self._full else 0
        return commit_deadline(self._first_opened, records, self._interval_ms, self._max_records)

    def restart(self) -> None:
        self._first_opened, self._full = None, False

    def waiting(self, phases: Collection[Phase], owned: Mapping[int, T]) -> list[T]:
        """The tasks of `owned` now in one of `phases`, by partition. Forgets the tasks that moved on to a phase that
        needs no attention, and those the loop no longer owns (closed, or replaced by a new task of the partition)."""
        found: list[T] = []
        for task in list(self._waiting):
            current = owned.get(task.partition)
            if task.phase not in _WAITING or current is not task:
                self._waiting.discard(task)
            elif current.phase in phases:
                found.append(current)
        return sorted(found, key=lambda t: t.partition)
