"""Fast failure detection (FAILURE_DETECTION_MS, pipeline/kafka/liveness.py) against real processes on a real broker:
a SIGKILLed member is removed from the group by its peer long before its session time-out, and a member that was only
paused (a false positive) is fenced, rejoins, and the run stays exactly-once. Session and transaction time-outs are
30 s here, so that a take-over before them can only be the detector's doing."""

from __future__ import annotations

import time

from pipeline.testing.harness import group_owners
from tests.faults.conftest import PARTITIONS, assert_exactly_once
from tests.faults.test_process_faults import totals_input
from tests.support import eventually

SLOW_GROUP = {
    "failure_detection_ms": "1000",
    "session_timeout_ms": "30000",
    "transaction_timeout_ms": "30000",
    "group_instance_id": "",
}
REMOVED = "removed from group"


def _both_own_partitions(run) -> dict[str, list[int]] | None:
    owners = group_owners(run.bootstrap, run.app_id)
    return owners if len(owners) == 2 and all(owners.values()) else None


def test_a_sigkilled_member_is_removed_and_taken_over_before_its_session_times_out(fault_run):
    run = fault_run(**SLOW_GROUP)
    run.feed(totals_input(20_000, seed=21), seconds=12)
    fleet = run.start(2)
    owners = eventually(lambda: _both_own_partitions(run), 60, 0.2)
    time.sleep(2)  # mid-stream: the victim has a transaction open
    victim, survivor = fleet.instances
    victim.kill()
    killed_at = time.monotonic()
    # The survivor owns everything while the victim's session (30 s) and transaction (30 s) would still hold it.
    eventually(lambda: group_owners(run.bootstrap, run.app_id).get(survivor.name) == list(range(PARTITIONS)), 25, 0.2)
    assert time.monotonic() - killed_at < 25
    assert REMOVED in survivor.log_path.read_text(), survivor.log_tail()
    outcome = run.finish()
    assert victim.name in owners
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 20_000


def test_a_paused_member_is_removed_then_rejoins_and_the_run_stays_exactly_once(fault_run):
    """A false positive: 5 s of SIGSTOP against a 1 s bound. The paused member's producer is fenced and its membership
    gone; it wakes with an open transaction that cannot commit, rejoins, and takes partitions again. Woken, it does
    not remove its healthy peer (everyone looks silent to a process that was stopped)."""
    run = fault_run(**SLOW_GROUP)
    run.feed(totals_input(20_000, seed=22), seconds=14)
    fleet = run.start(2)
    eventually(lambda: _both_own_partitions(run), 60, 0.2)
    time.sleep(2)
    paused, peer = fleet.instances
    paused.pause()
    time.sleep(5)
    paused.resume()
    eventually(lambda: REMOVED in peer.log_path.read_text(), 10, 0.2)
    eventually(lambda: _both_own_partitions(run), 40, 0.5)  # rejoined, with partitions of its own again
    assert paused.alive, paused.log_tail()
    # Woken, it learns it is out either way round, a race between its next commit and its consumer's next poll: its
    # producer fenced (the commit refused), or its membership gone (lost: aborted, nothing committed).
    woken = paused.log_path.read_text()
    assert "fenced" in woken or "lost [" in woken, paused.log_tail()
    outcome = run.finish()
    assert REMOVED not in paused.log_path.read_text(), paused.log_tail()
    assert_exactly_once(outcome)
    assert outcome.verdict.outputs == 20_000
