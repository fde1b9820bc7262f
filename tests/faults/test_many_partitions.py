"""A backlog over many partitions drained under SIGKILLs (issue 23): the many-partition paths (the loop's schedule,
every open transaction committed in one round, fetches spread over 96 partitions) keep exactly-once. Runs in the
default PRODUCERS mode in the main suite, and in the other one beside it (tests/run.sh)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from pipeline.loading import load_app
from pipeline.testing import inputs
from pipeline.testing.faults import FaultRun
from pipeline.testing.harness import committed_offsets
from tests.faults.conftest import assert_exactly_once
from tests.support import eventually

TOTALS = "pipeline.examples.running_totals:app"  # stateful: every commit carries changelog records and checkpoints
PARTITIONS = 96
# Long enough for the kills to land mid-drain on a quiet machine: there 48 000 drained in ~2 s, the time one look at
# 96 partitions' committed offsets takes, and the third kill came after the drain.
RECORDS = 192_000
KILLS = 3


def test_sigkills_while_two_instances_drain_a_96_partition_backlog(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = FaultRun(load_app(TOTALS), TOTALS, kafka_bootstrap, PARTITIONS, tmp_path / "logs")
    try:
        records = list(inputs.running_totals_records(RECORDS, partitions=PARTITIONS, accounts=5_000, seed=23))
        written = inputs.produce(kafka_bootstrap, run.input_topic, records, partitions=PARTITIONS)
        assert len(written) == PARTITIONS  # every partition holds part of the backlog
        fleet = run.start(2)
        rng = random.Random(23)
        progress_at_kills = []
        for kill in range(KILLS):
            # Each kill once the drain has moved on since the last one, and before it is over: killed mid-drain.
            eventually(lambda floor=kill * RECORDS // 8: _committed(run) > floor, 120, 0.1)
            time.sleep(rng.uniform(0.0, 0.5))
            rng.choice(fleet.alive).kill()
            progress_at_kills.append(_committed(run))  # committed offsets only grow: below the end then too
            fleet.start(1)
        outcome = run.finish(timeout_s=240)
        assert all(n < RECORDS for n in progress_at_kills), f"killed after the drain: {progress_at_kills}"
        assert_exactly_once(outcome)
        assert outcome.verdict.outputs == RECORDS
    finally:
        run.abandon()


def _committed(run: FaultRun) -> int:
    """Input records the group has committed so far, all partitions. Read unstable: right after a SIGKILL, a stable
    read waits for the victim's open transactions to be aborted, and timed out after 10 s (a CI run)."""
    unstable = {"isolation.level": "read_uncommitted"}  # no require_stable: the last commits, at once
    offsets = committed_offsets(run.bootstrap, run.app_id, run.input_topic, list(range(PARTITIONS)), 10, unstable)
    return sum(max(offset, 0) for offset in offsets.values())
