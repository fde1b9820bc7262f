"""Mistakes fail fast and loud (docs/guarantees.md: fail-fast): the first record of a partition stopping it with
ON_POISON=stop, ..."""

from __future__ import annotations

import pytest

from pipeline.core.processing import PoisonRecordStop
from tests.harness import DLQ, Harness, msg, poison


# -- ON_POISON=stop on the first record a partition ever sees -------------------------------------------------------
def test_a_first_record_that_stops_its_partition_commits_nothing_of_it_and_no_offset() -> None:
    h = Harness(on_poison="stop", processing_max_attempts=2)
    task = h.task(committed=None)  # a new group: no committed offset, no position yet
    with pytest.raises(PoisonRecordStop, match=r"in\[2\]@0 failed 2 times"):
        task.process([poison(0), msg(1)])
    h.commit(task)  # what the runner does before it stops p: nothing of p to commit, and no TypeError
    assert task.next_offset is None and h.calls.produced(DLQ) == []
    assert not [a for name, a, _ in h.calls if name == "send_offsets_to_transaction"]
