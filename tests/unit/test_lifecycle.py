"""The phase table of an owned partition (pipeline/core/lifecycle.py): the moves it lists happen, any other one
raises."""

from __future__ import annotations

import pytest

from pipeline.core.lifecycle import TRANSITIONS, IllegalTransition, Lifecycle, Phase
from tests.harness import Harness, msg


class Owned(Lifecycle):
    def __init__(self, *path: Phase) -> None:
        super().__init__()
        self.partition = 7
        for phase in path:
            self._transition(phase)


ALLOWED = [(before, after) for before, targets in TRANSITIONS.items() for after in targets]
FORBIDDEN = [(before, after) for before in Phase for after in Phase if after not in TRANSITIONS[before]]
# A shortest way into each phase from NEW, through allowed moves only.
PATH = {
    Phase.NEW: (),
    Phase.RESTORING: (Phase.RESTORING,),
    Phase.RUNNING: (Phase.RUNNING,),
    Phase.REWINDING: (Phase.RUNNING, Phase.REWINDING),
    Phase.STOPPED: (Phase.RUNNING, Phase.STOPPED),
    Phase.DROPPED: (Phase.RUNNING, Phase.DROPPED),
    Phase.CLOSED: (Phase.CLOSED,),
}


def test_every_phase_has_a_row_and_a_way_in() -> None:
    assert set(TRANSITIONS) == set(Phase) == set(PATH)
    assert Owned().phase is Phase.NEW


@pytest.mark.parametrize(("before", "after"), ALLOWED, ids=[f"{a.value}->{b.value}" for a, b in ALLOWED])
def test_an_allowed_move_happens(before: Phase, after: Phase) -> None:
    owned = Owned(*PATH[before])
    owned._transition(after)
    assert owned.phase is after


@pytest.mark.parametrize(("before", "after"), FORBIDDEN, ids=[f"{a.value}->{b.value}" for a, b in FORBIDDEN])
def test_a_move_the_table_does_not_list_raises_and_changes_nothing(before: Phase, after: Phase) -> None:
    owned = Owned(*PATH[before])
    with pytest.raises(IllegalTransition, match=f"p7: {before.value} -> {after.value}"):
        owned._transition(after)
    assert owned.phase is before


@pytest.mark.parametrize("after", [Phase.RUNNING, Phase.RESTORING, Phase.DROPPED])
def test_nothing_leaves_closed_and_a_dropped_partition_never_runs_again(after: Phase) -> None:
    for before in (Phase.CLOSED, Phase.DROPPED):
        with pytest.raises(IllegalTransition):
            Owned(*PATH[before])._transition(after)


def test_assigning_the_phase_is_the_same_check() -> None:
    owned = Owned(Phase.RUNNING, Phase.DROPPED)
    with pytest.raises(IllegalTransition):
        owned.phase = Phase.RUNNING
    owned.phase = Phase.DROPPED  # the phase it is in: no move
    assert owned.phase is Phase.DROPPED


def test_stop_records_why() -> None:
    owned = Owned(Phase.RUNNING)
    owned.stop("in[7]@3 failed 3 times")
    assert (owned.phase, owned.error) == (Phase.STOPPED, "in[7]@3 failed 3 times")
    with pytest.raises(IllegalTransition):
        Owned(Phase.RESTORING).stop("not running yet")


def test_the_task_moves_only_through_the_table() -> None:
    h = Harness()
    task = h.new_task(2)
    task.txn.fence()
    task.start(0)
    with pytest.raises(IllegalTransition, match="restoring -> restoring"):
        task.start(0)  # started twice
    task.restored(task.state, None, None)
    task.process([msg(0)])
    task.drop("fenced")
    with pytest.raises(IllegalTransition, match="dropped -> running"):
        task.try_seek_back(h.consumer)  # a dropped partition never runs again
    h.close(task, commit=True)
    assert task.phase is Phase.CLOSED
