"""What the test driver does where the runtime stops a partition (docs/guarantees.md: fail-fast, no-silent-skip).

The runtime logs an ERROR, pauses p and goes on with its other partitions; a unit test that only looks at what a call
returned would see `[]` and pass. So by default (on_stop="raise") the driver's call that stopped p raises
`PartitionStopped`, once the call has done the rest of its work (committed what came before, the other partitions
processed): what is committed is the same in both modes. on_stop="record" is the runtime's behaviour, for a test
about the stop itself: `driver.stopped` says which partitions stopped and why, and `driver.verify()` is not ok while
one is stopped (the checker alone would take its records for records not processed yet).
"""

from __future__ import annotations

from typing import Literal, NoReturn

from pipeline.core.processing import PoisonRecordStop, stop_message
from pipeline.state.versions import StateVersionError
from pipeline.testing.oracle import Verdict

OnStop = Literal["raise", "record"]
ON_STOP = ("raise", "record")


class PartitionStopped(Exception):
    """A partition stopped where the runtime stops it: a mistake in the code (`process` or `on_timer` returning
    something other than a list of Outputs, a timer scheduled without on_timer), a record or timer failing every
    attempt with ON_POISON=stop, a dead-letter storm, state written by a newer state version. The message is the
    runtime's ERROR (the partition, the record or timer, the cause and the fix); `__cause__` (also `error`) is the
    original exception, `fix` what to do. A dead-lettered record is no stop."""

    def __init__(self, partition: int, position: int | None, error: Exception, restoring: bool = False) -> None:
        # position: p's next input offset (None: p stopped at its first record, or while restoring)
        self.partition, self.position, self.error = partition, position, error
        if restoring:  # a StateVersionError: its message says which code can read the state
            message = f"p{partition}: STOPPED at its restore: {error}"
            self.fix = "Deploy code whose state_version (and migrate) can read this state."
        else:
            message, self.fix = stop_message(partition, position, error), getattr(error, "fix", PoisonRecordStop.fix)
        super().__init__(message)
        self.__cause__ = error


class Stops:
    """The driver's stopped partitions, and the stops its current call has not raised yet."""

    def __init__(self, on_stop: str) -> None:
        if on_stop not in ON_STOP:
            raise ValueError(f"on_stop={on_stop!r}: one of {', '.join(map(repr, ON_STOP))}")
        self.on_stop = on_stop
        self.stopped: dict[int, PartitionStopped] = {}
        self._unraised: list[PartitionStopped] = []

    def stopped_at(self, partition: int, position: int | None, error: PoisonRecordStop) -> None:
        """p stopped (the driver has logged the runtime's ERROR and paused p)."""
        stop = self.stopped[partition] = PartitionStopped(partition, position, error)
        if self.on_stop == "raise":
            self._unraised.append(stop)

    def restore_refused(self, partition: int, error: StateVersionError) -> NoReturn:
        """The runtime's process ends there: raised in both modes, as PartitionStopped unless on_stop="record"."""
        if self.on_stop == "record":
            raise error
        raise PartitionStopped(partition, None, error, restoring=True) from error

    def started(self, partition: int) -> None:
        """A new owner starts p again (with the same code, it stops again at the same record)."""
        self.stopped.pop(partition, None)

    def raise_new(self) -> None:
        """The first stop of the call ending now, the others as its notes."""
        if self._unraised:
            first, *others = self._unraised
            self._unraised = []
            for other in others:
                first.add_note(f"also: {other}")
            raise first

    def judged(self, verdict: Verdict) -> Verdict:
        """The checker's verdict, not ok while a partition is stopped: nothing of it is processed from there on."""
        for p, stop in sorted(self.stopped.items()):
            verdict.losses.add(f"stopped p{p}", f"{stop} Nothing of p{p} is processed from there on.")
        return verdict
